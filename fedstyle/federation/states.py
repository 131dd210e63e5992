"""Every client's persistent state (``ClientContext.state``) within a memory budget: the rest on disk.

FedDyn keeps one gradient vector per client, FedBN its local layers, MOON a previous model: with
thousands of clients that is gigabytes, of which a round needs only its own clients'. A
:class:`ClientStates` store keeps the most recently used states in memory up to a byte budget
(``--state-budget``) and the others on disk, one safetensors file per client, memory-mapped when
a client comes back into a round.

Rules (what the round driver may rely on):

- ``store[cid]`` hands out client ``cid``'s state dict — loaded from disk, or empty for a client
  that has none yet — to mutate in place during that client's phase. Handing a client out first
  makes room for it: the least recently used *other* clients are moved to disk until the states in
  memory fit the budget. :meth:`settle` (the driver calls it after each phase) does the same for
  every client, so between phases and rounds the memory held is at most the budget; during a
  phase, at most the budget plus that one client's state.
- A state is written when it leaves memory if it was handed out since it was last written (a
  handed-out dict is taken as changed: the store cannot see in-place edits). Files are written
  atomically (a temporary beside it, then renamed) and never overwritten: each write gets a new
  name ``<cid>.<token>.<n>.safetensors`` (``token``: random per store object, ``n`` counts its
  writes), so the files a checkpoint lists stay as they were until a later checkpoint replaces
  them, whatever another process (a resumed run) writes beside them.
- Memory is counted as the tensors' bytes plus :data:`TENSOR_OVERHEAD` per tensor.
- ``budget=None``: everything stays in memory (the peer-to-peer simulator, where every device
  takes part in every iteration).

Checkpoints — every client's state, so a resumed run equals an uninterrupted one:

- while nothing was ever moved to disk, :meth:`checkpoint_tensors` returns every state as
  ``client/<cid>/<name>`` tensors for the run's checkpoint file (as before this store existed);
- once states live on disk, a checkpoint writes the states changed since the last one to new
  files and lists every client's file with its size and SHA-256 (as JSON in the uint8 tensor
  :data:`MANIFEST_KEY`; the checkpoint's own SHA-256 covers that list). A checkpoint then costs the
  states that changed since the last one, not all of them; the run directory holds every
  client's state once (``client_states/``), plus the files of the states changed since the last
  checkpoint. :meth:`checkpoint_saved` (after the checkpoint file is in place) deletes the files
  no checkpoint and no client needs any more; :meth:`restore` deletes those a killed run left
  after its last checkpoint and verifies the sizes and SHA-256 of the files the checkpoint lists.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
from safetensors.torch import save as safetensors_bytes

from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.federation.rounds import client_state_tensors, load_client_states
from fedstyle.io import atomic_write, remove_leftovers

#: bytes counted per state tensor besides its data (the tensor object and its storage header)
TENSOR_OVERHEAD = 256
#: ``--state-budget auto``: this fraction of the machine's memory (its cgroup limit where lower)
AUTO_FRACTION = 0.1
#: the store's folder inside a run directory
STATES_DIR = "client_states"
#: the checkpoint tensor listing the client-state files (UTF-8 JSON as uint8)
MANIFEST_KEY = "client_states/files"
_SUFFIX = ".safetensors"
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class StateFileError(FedstyleError):
    """A client-state file a checkpoint lists is missing or damaged."""


def machine_memory() -> int:
    """Bytes of memory this process may use: physical memory, or the cgroup (v2 or v1) limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def parse_budget(text: str) -> int | None:
    """``--state-budget``: ``auto`` (:data:`AUTO_FRACTION` of :func:`machine_memory`), ``unlimited``
    (None: never spill), or a size such as ``0``, ``512MB``, ``2GiB``, ``1.5GB``, ``1000000`` (bytes)."""
    value = str(text).strip().lower().replace(" ", "")
    if value == "auto":
        return int(AUTO_FRACTION * machine_memory())
    if value in ("unlimited", "none", "inf"):
        return None
    number = value.rstrip("kmgtib")
    unit = value[len(number):] or "b"
    try:
        amount = float(number)
    except ValueError:
        amount = float("nan")
    if unit not in _UNITS or not amount >= 0 or amount == float("inf"):
        raise ConfigError(f"--state-budget {text!r} is not a size; give auto, unlimited, or bytes with an optional "
                          "unit such as 512MB or 2GiB")
    return int(amount * _UNITS[unit])


def state_nbytes(state: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() + TENSOR_OVERHEAD for t in state.values())


@dataclass(frozen=True)
class StateFile:
    """One client's state on disk: the file's name in the store's folder, its size and SHA-256."""

    name: str
    nbytes: int
    sha256: str

    def as_list(self) -> list:
        return [self.name, self.nbytes, self.sha256]


def _write_bytes(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def load_mapped(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors, memory-mapped copy-on-write (on CPU; copied to another device).

    Changing a tensor in place never changes the file (a private mapping).
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    raw = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    start = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        piece = raw[start + begin : start + end]
        if (start + begin) % dtype.itemsize:  # misaligned for a view of this dtype: copy it
            piece = piece.clone()
        tensor = piece.view(dtype).reshape(info["shape"])
        out[name] = tensor if device.type == "cpu" else tensor.to(device)
    return out


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


class ClientStates:
    """The clients' persistent states, ``budget`` bytes of them in memory at most (see the module doc).

    ``directory``: where states go when they leave memory (``OUT/client_states`` in a run; a
    temporary folder, removed with the store, until :meth:`use_directory` names one).
    """

    def __init__(self, num_clients: int, budget: int | None = None, device: torch.device | str = "cpu",
                 directory: str | Path | None = None):
        if budget is not None and budget < 0:
            raise ConfigError(f"the client-state budget must be >= 0 bytes, got {budget}")
        self.num_clients, self.budget, self.device = num_clients, budget, torch.device(device)
        self._memory: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()  # least recently used first
        self._bytes: dict[int, int] = {}  # measured bytes of resident clients not handed out since
        self._total = 0  # sum of _bytes
        self._out: set[int] = set()  # handed out since the last measurement
        self._dirty: set[int] = set()  # resident and possibly different from their file (or without one)
        self._files: dict[int, StateFile] = {}  # each client's latest file
        self._committed: dict[int, StateFile] = {}  # the files the last saved checkpoint lists
        self._writes = 0
        self._token = secrets.token_hex(4)
        self._directory = Path(directory) if directory is not None else None
        self._temporary: weakref.finalize | None = None
        self.peak_bytes = 0  # most bytes measured in memory (between phases)
        self.spilled = 0  # states written on leaving memory
        self.loaded = 0  # states read back from disk

    # -- the mapping ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_clients

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.num_clients))

    def _check(self, cid: int) -> int:
        if not 0 <= cid < self.num_clients:
            raise KeyError(cid)
        return int(cid)

    def __getitem__(self, cid: int) -> dict[str, torch.Tensor]:
        cid = self._check(cid)
        state = self._memory.get(cid)
        if state is None:
            state = self._read(cid) if cid in self._files else {}
            self._memory[cid] = state
        else:
            self._memory.move_to_end(cid)
        self._hand_out(cid)
        return state

    def __setitem__(self, cid: int, state: dict[str, torch.Tensor]) -> None:
        cid = self._check(cid)
        self._memory[cid] = state
        self._memory.move_to_end(cid)
        self._hand_out(cid)

    def _hand_out(self, cid: int) -> None:
        self._total -= self._bytes.pop(cid, 0)
        self._out.add(cid)
        self._dirty.add(cid)
        self._make_room(keep=cid)

    # -- memory -----------------------------------------------------------------------------------
    @property
    def resident_bytes(self) -> int:
        """Bytes of the states in memory (measuring those handed out since the last measurement)."""
        self._measure()
        return self._total

    @property
    def resident_clients(self) -> list[int]:
        return list(self._memory)

    @property
    def on_disk(self) -> int:
        """Clients whose state has a file (in memory too, or only there)."""
        return len(self._files)

    def _measure(self, keep: int | None = None) -> None:
        for cid in [c for c in self._out if c != keep]:
            self._bytes[cid] = state_nbytes(self._memory[cid])
            self._total += self._bytes[cid]
            self._out.discard(cid)

    def _make_room(self, keep: int | None = None) -> None:
        self._measure(keep)
        self.peak_bytes = max(self.peak_bytes, self._total)
        if self.budget is None or self._total <= self.budget:
            return
        for cid in list(self._memory):
            if self._total <= self.budget:
                break
            if cid != keep:
                self._evict(cid)

    def settle(self) -> None:
        """Fit the states in memory to the budget (after a phase: no client's dict is in use)."""
        self._make_room(keep=None)

    def _evict(self, cid: int) -> None:
        if cid in self._dirty:
            self._write(cid, self._memory[cid])
            self.spilled += 1
        del self._memory[cid]
        self._total -= self._bytes.pop(cid, 0)

    # -- files ------------------------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="fedstyle-client-states-"))
            self._temporary = weakref.finalize(self, shutil.rmtree, str(self._directory), True)
        return self._directory

    def use_directory(self, directory: str | Path) -> None:
        """Keep the states that leave memory in ``directory`` (a run's ``client_states``) from now on."""
        directory = Path(directory)
        if self._files and directory != self._directory:
            raise FedstyleError("the client-state store already holds files elsewhere; name its folder first")
        if self._temporary is not None:
            self._temporary()
            self._temporary = None
        self._directory = directory

    def _write(self, cid: int, state: Mapping[str, torch.Tensor]) -> None:
        # own contiguous CPU copies: safetensors refuses tensors that share storage
        tensors = {k: v.detach().to("cpu").clone(memory_format=torch.contiguous_format) for k, v in state.items()}
        data = safetensors_bytes(tensors)
        self._writes += 1
        entry = StateFile(f"{cid}.{self._token}.{self._writes}{_SUFFIX}", len(data), hashlib.sha256(data).hexdigest())
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write(self.directory / entry.name, lambda tmp: _write_bytes(tmp, data))
        previous = self._files.get(cid)
        self._files[cid] = entry
        self._dirty.discard(cid)
        if previous is not None and self._committed.get(cid) != previous:
            (self.directory / previous.name).unlink(missing_ok=True)

    def _read(self, cid: int) -> dict[str, torch.Tensor]:
        entry = self._files[cid]
        path = self.directory / entry.name
        try:
            size = path.stat().st_size
        except OSError:
            raise StateFileError(f"client {cid}'s state file {path} is missing; the run directory lost it — "
                                 "restore it from a copy, or start the run over") from None
        if size != entry.nbytes:
            raise StateFileError(f"client {cid}'s state file {path} has {size} bytes, {entry.nbytes} were written; "
                                 "restore it from a copy, or start the run over")
        self.loaded += 1
        state = load_mapped(path, self.device)
        self._dirty.discard(cid)  # as its file says (until handed out)
        return state

    # -- checkpoints ------------------------------------------------------------------------------
    @property
    def spills(self) -> bool:
        """Whether states live on disk (then checkpoints list files instead of holding the states)."""
        return bool(self._files)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The states for the checkpoint file: all of them as ``client/<cid>/<name>`` while nothing is
        on disk; else the states changed since the last checkpoint are written to files and one
        tensor, :data:`MANIFEST_KEY`, lists every client's file."""
        self._measure()
        if not self.spills:
            return client_state_tensors(self._memory)
        for cid in sorted(self._dirty):
            self._write(cid, self._memory[cid])
        return {MANIFEST_KEY: _json_tensor(self.manifest())}

    def manifest(self) -> dict[str, Any]:
        """Every client's latest file: ``{"dir": ..., "files": {cid: [name, bytes, sha256]}}``."""
        return {"dir": STATES_DIR, "files": {str(cid): f.as_list() for cid, f in sorted(self._files.items())}}

    def checkpoint_saved(self) -> None:
        """The checkpoint listing the current files is in place: drop the files only older ones listed."""
        old = self._committed
        self._committed = dict(self._files)
        current = {f.name for f in self._files.values()}
        for entry in old.values():
            if entry.name not in current:
                (self.directory / entry.name).unlink(missing_ok=True)

    def clear(self) -> None:
        """No client has state (a run starting from round 0): files in the store's folder are deleted."""
        self.restore({})

    def restore(self, tensors: Mapping[str, torch.Tensor], verify: bool = True) -> None:
        """Set every state to a checkpoint's (:meth:`checkpoint_tensors`): its ``client/...`` tensors
        and the files its :data:`MANIFEST_KEY` lists.

        Files in the store's folder that the checkpoint does not list (written after the checkpoint
        by the run that was killed, or temporaries of dead processes) are deleted; listed files
        are checked for size and, with ``verify``, SHA-256.
        """
        self._memory.clear()
        self._bytes.clear()
        self._total = 0
        self._out.clear()
        self._dirty.clear()
        self._files, self._committed = {}, {}
        manifest = _tensor_json(tensors[MANIFEST_KEY]) if MANIFEST_KEY in tensors else {}
        listed = {int(cid): StateFile(*entry) for cid, entry in manifest.get("files", {}).items()}
        for cid, state in load_client_states(tensors, self.num_clients).items():
            if state and cid not in listed:
                self._memory[cid] = state
                self._out.add(cid)
                self._dirty.add(cid)
        folder = self._directory
        if folder is not None and folder.is_dir():
            remove_leftovers(folder, ".*.tmp")
            keep = {f.name for f in listed.values()}
            for path in folder.glob(f"*{_SUFFIX}"):
                if path.name not in keep:
                    path.unlink(missing_ok=True)
        for cid, entry in listed.items():
            if not 0 <= cid < self.num_clients:
                raise StateFileError(f"the checkpoint lists a state file of client {cid}, but the run has "
                                     f"{self.num_clients} clients")
            path = self.directory / entry.name
            if not path.is_file() or path.stat().st_size != entry.nbytes:
                raise StateFileError(f"client {cid}'s state file {path} is missing or has the wrong size; restore "
                                     "the run directory's client_states/ from a copy, or start the run over with "
                                     "--restart")
            if verify and _file_sha256(path) != entry.sha256:
                raise StateFileError(f"client {cid}'s state file {path} is damaged (its SHA-256 does not match the "
                                     "checkpoint's); restore it from a copy, or start the run over with --restart")
        self._files = dict(listed)
        self._committed = dict(listed)
        self.settle()


def _json_tensor(data: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(data, sort_keys=True).encode()), dtype=torch.uint8)


def _tensor_json(tensor: torch.Tensor) -> Any:
    try:
        return json.loads(bytes(tensor.detach().cpu().numpy()).decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise StateFileError(f"the checkpoint's {MANIFEST_KEY} is not a list of client-state files") from None


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
