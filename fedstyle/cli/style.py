"""``fedstyle style ...``: train the offline style-transfer decoder, draw a style-transfer demo grid."""

from __future__ import annotations

import argparse

STYLE_EPILOG = """\
examples:
  fedstyle style demo                             digits4: every domain's style on every domain's digits (PNG)
  fedstyle style demo --backend adain --hp vgg_weights=vgg_normalised.pth --hp decoder_weights=decoder.pth
  fedstyle style train-decoder                    retrain the lite decoder (GPU recommended; writes the user cache)
  fedstyle style train-decoder --steps 200 --device cpu --out my_decoder.safetensors
"""

TRAIN_EPILOG = """\
The lite backend = AdaIN over ImageNet-pretrained EfficientNet-Lite0 features (cut after --stage)
and this decoder. Loss (AdaIN paper): ||enc(dec(t)) - t||^2 + style-weight * sum over stages of
||mu, sigma of enc(dec(t)) - mu, sigma of the style image||^2, t = AdaIN(enc(content), style).
Training images: digits4 (add more with --datasets digits4,fashion4; unavailable ones are skipped)
and crops of photographs bundled with scikit-image/scikit-learn; nothing is downloaded. The file's
metadata records the options and the command that reproduces it. Use it with the backend option
decoder_weights=PATH (`fedstyle style demo --hp decoder_weights=PATH`).

examples:
  fedstyle style train-decoder --device cuda        the shipped decoder's settings (~3 min on an H100, hours on a CPU)
  fedstyle style train-decoder --steps 100 --quiet --out /tmp/dec.safetensors
"""


#: DecoderTrainingConfig's defaults, repeated so that building the parser needs no torch (a test keeps them equal)
TRAIN_DEFAULTS = dict(steps=6000, batch_size=32, image_size=96, stage="layer1", width=16, style_weight=5.0, lr=1e-3,
                      seed=0, datasets=("digits4",), photos=True)


def _cmd_train_decoder(args: argparse.Namespace) -> int:
    from fedstyle.style.transfer.decoder_training import DecoderTrainingConfig, train_decoder

    datasets = tuple(d for d in args.datasets.split(",") if d and d != "none")
    config = DecoderTrainingConfig(steps=args.steps, batch_size=args.batch_size, image_size=args.image_size,
                                   stage=args.stage, width=args.width, style_weight=args.style_weight, lr=args.lr,
                                   seed=args.seed, datasets=datasets, photos=args.photos)
    path = train_decoder(config, out=args.out, device=args.device, quiet=args.quiet)
    print(f"wrote {path}; use it with the lite backend option decoder_weights={path}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from fedstyle.algorithms.hparams import parse_assignments
    from fedstyle.style.transfer.demo import style_demo

    options = parse_assignments(args.hp or [])
    out = style_demo(args.out, dataset=args.dataset, backend=args.backend, options=options, per_domain=args.per_domain,
                     seed=args.seed, device=args.device, data_root=args.data_root,
                     skip_bad_images=args.skip_bad_images)
    print(f"wrote {out}")
    return 0


def add_style_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``style`` with its actions ``train-decoder`` and ``demo`` to the main parser's subcommands."""
    # Parsers are built for every fedstyle command: nothing here may import torch (2-3 s).
    defaults = argparse.Namespace(**TRAIN_DEFAULTS)
    style = sub.add_parser("style", help="image style transfer: demo grid, train the offline decoder",
                           description="Image-level style transfer (AdaIN-type backends used by CCST and PARDON).",
                           epilog=STYLE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = style.add_subparsers(dest="style_command", metavar="ACTION", required=True)

    train = actions.add_parser("train-decoder", help="train the lite backend's decoder (AdaIN loss)",
                               description="Train the decoder of the offline `lite` style-transfer backend.",
                               epilog=TRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--steps", type=int, default=defaults.steps, help=f"optimiser steps (default: {defaults.steps})")
    train.add_argument("--batch-size", type=int, default=defaults.batch_size,
                       help=f"content and style images per step (default: {defaults.batch_size})")
    train.add_argument("--image-size", type=int, default=defaults.image_size,
                       help="training crop side; also the backend's min_size: smaller images are upsampled to it "
                       f"before encoding (default: {defaults.image_size})")
    train.add_argument("--stage", default=defaults.stage, choices=("stem", "layer1", "layer2", "layer3"),
                       help=f"EfficientNet-Lite0 stage where AdaIN runs (default: {defaults.stage})")
    train.add_argument("--width", type=int, default=defaults.width,
                       help=f"channels of the decoder's last convolutions (default: {defaults.width})")
    train.add_argument("--style-weight", type=float, default=defaults.style_weight,
                       help=f"lambda of the style loss (default: {defaults.style_weight:g})")
    train.add_argument("--lr", type=float, default=defaults.lr, help=f"Adam learning rate (default: {defaults.lr:g})")
    train.add_argument("--datasets", default=",".join(defaults.datasets),
                       help="comma-separated datasets to train on; unavailable ones are skipped (default: %(default)s)")
    train.add_argument("--no-photos", dest="photos", action="store_false", help="leave out the bundled photographs")
    train.add_argument("--seed", type=int, default=defaults.seed,
                       help=f"seed of initialisation and batches (default: {defaults.seed})")
    train.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    train.add_argument("--out", metavar="FILE.safetensors",
                       help="where to write the decoder (default: <user cache>/style/lite_decoder-STAGE.safetensors)")
    train.add_argument("--quiet", action="store_true", help="no progress bar or messages")
    train.set_defaults(func=_cmd_train_decoder)

    demo = actions.add_parser("demo", help="PNG grid: content images x styles (first row the style images)",
                              description="Restyle a few images of every domain to every domain's overall style "
                              "(CCST Eq. 8) and to single style images; writes a PNG grid whose first row shows "
                              "the style images and first column the content images.",
                              epilog=STYLE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--dataset", default="digits4", help="dataset (default: digits4)")
    demo.add_argument("--data-root", help="dataset folder (folder datasets, fashion4's idx files)")
    demo.add_argument("--skip-bad-images", action="store_true",
                      help="leave out unreadable images of a folder dataset (default: refuse them, naming the file)")
    demo.add_argument("--backend", default="lite",
                      help="style-transfer backend: lite (offline), adain (public AdaIN weights), fft (default: lite)")
    demo.add_argument("--hp", action="append", metavar="NAME=VALUE",
                      help="backend option, e.g. decoder_weights=PATH (repeatable)")
    demo.add_argument("--per-domain", type=int, default=2, help="content images per domain (default: 2)")
    demo.add_argument("--seed", type=int, default=0, help="which images are drawn (default: 0)")
    demo.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    demo.add_argument("--out", default="style_demo.png", metavar="FILE.png", help="output image (default: %(default)s)")
    demo.set_defaults(func=_cmd_demo)
