"""Reader and writer for the IDX format of (Fashion-)MNIST, plain or gzip-compressed.

Layout (http://yann.lecun.com/exdb/mnist/): two zero bytes, a type code, the number of
dimensions ``k``, then ``k`` big-endian uint32 sizes and the row-major big-endian data.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np

from fedstyle.errors import DataError
from fedstyle.io import atomic_write

IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"IDX file {path} does not exist") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise DataError(f"{path} is not a complete gzip file ({err}); download it again") from None


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (``.gz`` decompressed on the fly) into a native-endian numpy array."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise DataError(f"{path} is not an IDX file (bad magic number {raw[:4].hex() or 'empty file'})")
    dtype, ndim = IDX_DTYPES[raw[2]], raw[3]
    header_size = 4 + 4 * ndim
    if len(raw) < header_size:
        raise DataError(f"{path} is truncated: its header promises {ndim} dimensions but the file ends first")
    shape = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header_size + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        problem = "truncated" if len(raw) < expected else "longer than its header says"
        raise DataError(
            f"{path} is {problem}: shape {shape} needs {expected} bytes, found {len(raw)}; download it again"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header_size).reshape(shape)
    return data.astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file (gzip-compressed if ``path`` ends in ``.gz``), atomically."""
    path = Path(path)
    array = np.asarray(array)
    codes = {dt.newbyteorder("="): code for code, dt in IDX_DTYPES.items()}
    code = codes.get(array.dtype.newbyteorder("="))
    if code is None:
        raise DataError(f"IDX cannot store dtype {array.dtype}; use one of {sorted(str(d) for d in codes)}")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    payload = header + np.ascontiguousarray(array, dtype=IDX_DTYPES[code]).tobytes()
    if path.suffix == ".gz":
        payload = gzip.compress(payload, mtime=0)
    atomic_write(path, lambda tmp: tmp.write_bytes(payload))
