"""A small reader/writer of the safetensors format (no pickle, no dependency).

Layout: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__":
{str: str}}, then the raw little-endian tensor bytes. The reader checks every offset against the file size, so a
truncated or corrupted file is an error naming the file, never a partial load; the writer returns the size and
sha256 of what it wrote, for the manifest.
"""
import hashlib
import json
import mmap
import os
import struct

import torch

from .errors import CheckpointCorruptError

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("uint16", "U16"),
                     ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _name):
        DTYPES[getattr(torch, _name)] = _code
BY_CODE = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 256 << 20
_CHUNK = 64 << 20
_HASH_CHUNK = 8 << 20      # the pages a checksum keeps resident at a time


def _bytes_of(t):
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


class Deferred:
    """A 1-D tensor of `numel` x `dtype` that write_file asks for (fetch()) only when its turn comes to be written:
    a ZeRO unit's states on NVMe are in host memory one unit at a time."""

    def __init__(self, fetch, dtype, numel, shape=None):
        self.fetch, self.dtype = fetch, dtype
        self.shape = tuple(int(d) for d in shape) if shape is not None else (int(numel),)
        self._numel = int(numel)

    def numel(self):
        return self._numel

    def element_size(self):
        return torch.empty(0, dtype=self.dtype).element_size()


def write_file(path, tensors, metadata=None, fault=None):
    """Write {name: tensor or Deferred} to `path` (fsynced). Returns {"size": bytes, "sha256": hex}. `fault(stage)`
    is the test hook of the kill tests (called after the header and after each tensor)."""
    header, offset, order = {}, 0, []
    for name, t in tensors.items():
        if t.dtype not in DTYPES:
            raise TypeError(f"{path}: tensor {name!r} has dtype {t.dtype}, which safetensors cannot store")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
        order.append((name, t))
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)      # the data starts 8-byte aligned
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for chunk in (struct.pack("<Q", len(raw)), raw):
            f.write(chunk)
            digest.update(chunk)
        if fault:
            fault("header")
        for name, t in order:
            if isinstance(t, Deferred):
                got = t.fetch()
                if got.dtype != t.dtype or got.numel() != t.numel():
                    raise RuntimeError(f"{path}: tensor {name!r} changed between the header and its write")
                t = got
            data = memoryview(_bytes_of(t))
            for i in range(0, len(data), _CHUNK):
                part = data[i:i + _CHUNK]
                f.write(part)
                digest.update(part)
            t = data = part = None   # freed before the next fetch: one Deferred tensor in memory at a time
            if fault:
                fault("tensor")
        f.flush()
        os.fsync(f.fileno())
    return {"size": 8 + len(raw) + offset, "sha256": digest.hexdigest()}


def _sha256(buf):
    """sha256 of a mapped file, chunk by chunk, each chunk's pages dropped once hashed: checking a file costs no
    more resident memory than one chunk, whatever its size."""
    digest, view = hashlib.sha256(), memoryview(buf)
    drop = isinstance(buf, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED")
    for i in range(0, len(view), _HASH_CHUNK):
        digest.update(view[i:i + _HASH_CHUNK])
        if drop:
            buf.madvise(mmap.MADV_DONTNEED, i, min(_HASH_CHUNK, len(view) - i))
    view.release()
    return digest.hexdigest()


class SafeTensorsFile:
    """One file read whole into memory, checked, with tensors handed out as views of that buffer."""

    def __init__(self, path, expect=None):
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                # mapped, not read: the page cache's pages serve the checksum and the copies into the engine
                # directly. Reading into fresh memory first cost 2.4 s of a 1 GB load here (each first touch of
                # a page is a fault on this VM) and a second copy. Private (copy-on-write): nothing is written
                # back. A checkpoint's files are never rewritten in place (a save of the same tag renames a new
                # folder over it), so the mapped bytes stay the ones checked below.
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else bytearray()
        except (OSError, ValueError) as err:
            raise CheckpointCorruptError(f"{path}: cannot be read ({err})") from None
        if expect is not None:
            if expect.get("size") is not None and size != expect["size"]:
                raise CheckpointCorruptError(f"{path}: is {size} bytes but the manifest says {expect['size']} "
                                             "(truncated or replaced)")
            if expect.get("sha256") and _sha256(buf) != expect["sha256"]:
                raise CheckpointCorruptError(f"{path}: sha256 does not match the manifest (the file is corrupted)")
        self.buffer = buf
        self.header, self.data_start = self._parse(buf, size)
        self.metadata = self.header.pop("__metadata__", {}) or {}

    def _parse(self, buf, size):
        if size < 8:
            raise CheckpointCorruptError(f"{self.path}: {size} bytes is too short for a safetensors file (truncated)")
        (n,) = struct.unpack("<Q", bytes(buf[:8]))
        if n > MAX_HEADER or 8 + n > size:
            raise CheckpointCorruptError(f"{self.path}: header length {n} does not fit the {size}-byte file "
                                         "(truncated or not a safetensors file)")
        try:
            header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointCorruptError(f"{self.path}: the header is not valid JSON ({err}); the file is "
                                         "corrupted") from None
        if not isinstance(header, dict):
            raise CheckpointCorruptError(f"{self.path}: the header is not a JSON object")
        data_len, end = size - 8 - n, 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                lo, hi = info["data_offsets"]
                dtype = BY_CODE[info["dtype"]]
                numel = 1
                for d in info["shape"]:
                    numel *= int(d)
            except (KeyError, TypeError, ValueError) as err:
                raise CheckpointCorruptError(f"{self.path}: entry {name!r} is malformed ({err!r})") from None
            itemsize = torch.empty((), dtype=dtype).element_size()
            if not (0 <= lo <= hi <= data_len) or hi - lo != numel * itemsize:
                raise CheckpointCorruptError(f"{self.path}: tensor {name!r} spans bytes [{lo}, {hi}) but the data "
                                             f"section has {data_len} bytes (truncated or corrupted)")
            end = max(end, hi)
        if end != data_len:
            raise CheckpointCorruptError(f"{self.path}: {data_len - end} unexpected bytes after the last tensor")
        return header, 8 + n

    def keys(self):
        return list(self.header)

    def release(self):
        """Drop the pages of the file this process has read (they stay in the page cache): a streaming reader
        keeps its resident memory to what it is copying now. Views stay valid: a page read again is mapped again
        (the mapping is never written to)."""
        if isinstance(self.buffer, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            self.buffer.madvise(mmap.MADV_DONTNEED)

    def __contains__(self, name):
        return name in self.header

    def get(self, name):
        info = self.header.get(name)
        if info is None:
            raise CheckpointCorruptError(f"{self.path}: has no tensor {name!r} (the manifest lists it)")
        dtype, shape = BY_CODE[info["dtype"]], info["shape"]
        lo, hi = info["data_offsets"]
        if hi == lo:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(self.buffer, dtype=torch.uint8, count=hi - lo, offset=self.data_start + lo)
        return flat.view(dtype).reshape(shape)

    def tensors(self):
        return {name: self.get(name) for name in self.header}


def read_file(path, expect=None):
    """{name: tensor} of a whole file (copies, independent of the read buffer)."""
    f = SafeTensorsFile(path, expect)
    return {k: v.clone() for k, v in f.tensors().items()}
