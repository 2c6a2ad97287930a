"""Stand-ins for LangSplat's autoencoder/train.py ("train") and autoencoder/test.py ("test").

    cd run/ae && python tests/langsplat_standins/autoencoder.py train --dataset_path /data/scene --dataset_name scene
    cd run/ae && python tests/langsplat_standins/autoencoder.py test --dataset_path /data/scene --dataset_name scene

Both need --dataset_path and --dataset_name (no --output flag). train.py reads
<dataset>/language_features/*f.npy and writes ckpt/<dataset_name>/best_ckpt.pth relative to the
working directory, and only from epoch 96 (so --num_epochs must be at least 97). test.py loads that
file from the same working directory, with the same --encoder_dims/--decoder_dims, and writes
<dataset>/language_features_dim3/<name>_f.npy (3-dim) beside copies of the _s.npy files.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np


def parse(kind: str, argv):
    p = argparse.ArgumentParser()
    p.add_argument("--dataset_path", type=str, required=True)
    if kind == "train":
        p.add_argument("--num_epochs", type=int, default=100)
        p.add_argument("--lr", type=float, default=0.0001)
    p.add_argument("--encoder_dims", nargs="+", type=int, default=[256, 128, 64, 32, 3])
    p.add_argument("--decoder_dims", nargs="+", type=int, default=[16, 32, 64, 128, 256, 256, 512])
    p.add_argument("--dataset_name", type=str, required=True)
    return p.parse_args(argv)


def model(encoder_dims, decoder_dims):
    import torch.nn as nn

    def chain(dims):
        return nn.Sequential(*[nn.Linear(a, b) for a, b in zip(dims, dims[1:])])

    return nn.ModuleDict({"encoder": chain([512, *encoder_dims]), "decoder": chain([encoder_dims[-1], *decoder_dims])})


def dataset(data_dir: str):
    names = glob.glob(os.path.join(data_dir, "*f.npy"))
    parts = {Path(n).name.split(".")[0]: np.load(n) for n in names}
    return parts, np.concatenate(list(parts.values()), axis=0)


def train(args) -> int:
    import torch

    torch.manual_seed(0)
    os.makedirs(f"ckpt/{args.dataset_name}", exist_ok=True)
    _, data = dataset(f"{args.dataset_path}/language_features")
    x = torch.from_numpy(data)
    ae = model(args.encoder_dims, args.decoder_dims)
    opt = torch.optim.Adam(ae.parameters(), lr=args.lr)
    best = 100.0
    for epoch in range(args.num_epochs):
        loss = ((ae["decoder"](ae["encoder"](x)) - x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if epoch > 95 and loss.item() < best:
            best = loss.item()
            torch.save(ae.state_dict(), f"ckpt/{args.dataset_name}/best_ckpt.pth")
    return 0


def test(args) -> int:
    import torch

    data_dir, output_dir = f"{args.dataset_path}/language_features", f"{args.dataset_path}/language_features_dim3"
    os.makedirs(output_dir, exist_ok=True)
    for name in os.listdir(data_dir):
        if name.endswith("_s.npy"):
            shutil.copy(os.path.join(data_dir, name), os.path.join(output_dir, name))
    state = torch.load(f"ckpt/{args.dataset_name}/best_ckpt.pth")
    ae = model(args.encoder_dims, args.decoder_dims)
    ae.load_state_dict(state)
    parts, _ = dataset(data_dir)
    with torch.no_grad():
        for name, feat in parts.items():
            np.save(os.path.join(output_dir, name), ae["encoder"](torch.from_numpy(feat)).numpy())
    return 0


def main(kind: str, argv=None) -> int:
    args = parse(kind, sys.argv[1:] if argv is None else argv)
    return train(args) if kind == "train" else test(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
