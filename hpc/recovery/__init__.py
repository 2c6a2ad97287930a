"""recovery"""
