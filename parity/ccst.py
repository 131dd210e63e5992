"""Parity fixture for ``ccst``: CCST's style statistics and AdaIN style transfer in JeremyCJM/CCST.

Runs, from a checkout of the authors' repository at ``COMMIT`` (folder ``style_transfer/AdaIN``), with the AdaIN
network of ``net.py`` (``vgg`` cut after relu4_1 as their scripts do, and ``decoder``; weights from
``seeded_weights`` keyed ``vgg.<their key>`` / ``decoder.<their key>``, since no pretrained weights can be had
offline; the fixture keeps their sums), on fixed 64 x 64 uint8 images fed as ``image / 255`` (their
``transforms.ToTensor()``):

* the single-image style of each of 3 style images: ``calc_sum`` (``CCST_SingleStyleTransfer.py:55-67``) on its
  relu4_1 features, then mean, var = E[f^2] - mean^2 and std = sqrt(var + 1e-5) (``:199-203``);
* the overall style of the 3 images, read in batches of 2 and 1: ``calc_sum``
  (``mean_std_computation_effcientMem.py:102-115``) per batch, summed, then ``:135-137``;
* ``style_transfer`` (``CCST_OverallStyleTransfer.py:32-46``: relu4_1 features, ``adaIN_StyleStat_ContentFeat``
  of ``function.py:26-33``, whose content statistics are ``calc_mean_std``'s unbiased variance + 1e-5,
  ``function.py:4-12``, then the decoder) of 2 content images to the overall style at alpha 1, and of one to the
  first image's single style at alpha 0.6. The decoder's float output is stored.

No random draw is involved (the code's random choice of the style image is replaced by fixed ones). The
images are ``images()``'s fixed draws (not stored; their sums are). The scripts run their whole pipeline at
import, so the generator compiles only ``calc_sum`` and ``style_transfer`` from them
(:func:`parity.common.load_functions`; the code is read from the checkout, never copied); ``net.py`` and
``function.py`` are imported as they are. Nothing needs installing besides the project's environment. (A clone
of this repository may fail to check out its Git LFS files, e.g. ``decoder_iter_160000.pth.tar``; the generator
needs none of them.)

Run: ``.venv/bin/python -m parity.ccst --checkout /tmp/parity/CCST``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from parity.common import generate, importable, load_functions, seeded_weights, weight_sums

REPOSITORY = "JeremyCJM/CCST"
COMMIT = "87c3e448cfa28c366b58d17f8dffc5d3d83574e5"
NAME = "ccst"

SIZE = 64
STYLE_IMAGES, CONTENT_IMAGES = 3, 2
OVERALL_BATCHES = ((0, 2), (2, 3))
SINGLE_ALPHA = 0.6
SETTINGS = {"size": SIZE, "style_images": STYLE_IMAGES, "content_images": CONTENT_IMAGES,
            "overall_batches": OVERALL_BATCHES, "single_alpha": SINGLE_ALPHA, "seed": 0}


def images() -> dict[str, torch.Tensor]:
    """style (3, 3, 64, 64) and content (2, 3, 64, 64) uint8: smooth colour fields with texture."""
    g = torch.Generator().manual_seed(SETTINGS["seed"])
    out = {}
    for kind, count in (("style", STYLE_IMAGES), ("content", CONTENT_IMAGES)):
        base = torch.rand(count, 3, 4, 4, generator=g) * 200 + 25
        field = torch.nn.functional.interpolate(base, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
        texture = torch.randint(-30, 31, (count, 3, SIZE, SIZE), generator=g)
        out[kind] = (field + texture).clamp(0, 255).round().to(torch.uint8)
    return out


def weight_shapes() -> dict[str, tuple[int, ...]]:
    """The AdaIN encoder (up to relu4_1) and decoder, by their keys in ``net.py`` (fedstyle builds the same)."""
    from fedstyle.style.transfer.adain import RELU4_1, adain_decoder, vgg_normalised

    encoder = torch.nn.Sequential(*list(vgg_normalised().children())[: RELU4_1 + 1])
    shapes = {f"vgg.{k}": tuple(v.shape) for k, v in encoder.state_dict().items()}
    shapes.update({f"decoder.{k}": tuple(v.shape) for k, v in adain_decoder().state_dict().items()})
    return shapes


def weights() -> dict[str, torch.Tensor]:
    return seeded_weights(weight_shapes())


def run(checkout: Path) -> dict[str, torch.Tensor]:
    folder = checkout / "style_transfer" / "AdaIN"
    state = weights()
    with importable(folder):
        import net
        from function import adaIN_StyleStat_ContentFeat

        vgg = torch.nn.Sequential(*list(net.vgg.children())[:31])  # as their scripts (CCST_OverallStyleTransfer.py:121)
        vgg.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("vgg.")})
        decoder = net.decoder
        decoder.load_state_dict({k[8:]: v for k, v in state.items() if k.startswith("decoder.")})
        vgg.eval(), decoder.eval()
        single = load_functions(folder / "CCST_SingleStyleTransfer.py", ("calc_sum",), {"torch": torch})["calc_sum"]
        pooled = load_functions(folder / "mean_std_computation_effcientMem.py", ("calc_sum",),
                                {"torch": torch})["calc_sum"]
        transfer = load_functions(folder / "CCST_OverallStyleTransfer.py", ("style_transfer",),
                                  {"torch": torch, "adaIN_StyleStat_ContentFeat": adaIN_StyleStat_ContentFeat,
                                   "device": torch.device("cpu")})["style_transfer"]

        pics = images()
        style, content = pics["style"].float() / 255.0, pics["content"].float() / 255.0
        out = {f"image_sum/{k}": v.double().sum().reshape(1) for k, v in pics.items()}
        with torch.no_grad():
            means, stds = [], []
            for i in range(STYLE_IMAGES):  # CCST_SingleStyleTransfer.py:197-203
                feat_sum, feat_square_sum, count = single(vgg(style[i].unsqueeze(0)))
                feat_mean = feat_sum / float(count)
                feat_var = feat_square_sum / float(count) - feat_mean ** 2
                means.append(feat_mean)
                stds.append(torch.sqrt(feat_var + 1e-5))
            out["single/mean"], out["single/std"] = torch.cat(means).flatten(1), torch.cat(stds).flatten(1)

            all_feat_sum, all_feat_square_sum, all_count = 0, 0, 0  # mean_std_computation_effcientMem.py:117-137
            for start, stop in OVERALL_BATCHES:
                feat_sum, feat_square_sum, count = pooled(vgg(style[start:stop]))
                all_feat_sum, all_feat_square_sum = all_feat_sum + feat_sum, all_feat_square_sum + feat_square_sum
                all_count += count
            feat_mean = all_feat_sum / float(all_count)
            feat_var = all_feat_square_sum / float(all_count) - feat_mean ** 2
            feat_std = torch.sqrt(feat_var + 1e-5)
            out["overall/mean"], out["overall/std"] = feat_mean.flatten(1), feat_std.flatten(1)

            out["transfer/overall"] = transfer(vgg, decoder, content, [feat_mean, feat_std], 1.0)
            out["transfer/single"] = transfer(vgg, decoder, content[:1], [means[0], stds[0]], SINGLE_ALPHA)
    out.update(weight_sums(state))
    return out


def main(argv: list[str] | None = None) -> Path:
    return generate(NAME, __doc__, REPOSITORY, COMMIT, run, argv=argv,
                    description="CCST (style_transfer/AdaIN): single-image and overall relu4_1 styles and the "
                                "encoder -> AdaIN -> decoder transfer with seeded weights, 64 x 64 images",
                    settings=SETTINGS)


if __name__ == "__main__":
    main()
