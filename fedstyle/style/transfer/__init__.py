"""Image-level style transfer backends (see :mod:`fedstyle.style.transfer.base`)."""

from fedstyle.style.transfer.base import TRANSFER_BACKENDS, Style, StyleMismatchError, StyleTransfer

__all__ = ["Style", "StyleMismatchError", "StyleTransfer", "TRANSFER_BACKENDS"]
