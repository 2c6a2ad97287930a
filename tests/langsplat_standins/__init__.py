"""Stand-ins for the scripts of LangSplat (upstream and the DDP fork) and graphdeco's 3DGS.

    python -m tests.langsplat_standins.checkout /tmp/ls fork   # a fake checkout that runs them

Written from reading those scripts: the same flags (unknown ones rejected), defaults, output paths,
checkpoint tuples, GUI port and DDP variables, with arithmetic instead of training. They run on a
CPU in seconds and fail where the real scripts fail. Test fixtures: they do not ship with hpc.
"""
