"""Dropping the resident pages of a memory-mapped input range (madvise MADV_DONTNEED): a streaming reader of a
mapped file keeps in memory only what it copies now. Only pages of a mapping of a regular file are dropped (a
page touched again is read again from the page cache; these mappings are never written to): anonymous memory
would be zeroed by the same call, so an address outside a file mapping is left alone. Elsewhere than Linux (no
/proc/self/maps) it does nothing."""
import ctypes
import ctypes.util
import mmap

_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
try:
    _madvise = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).madvise
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
except (OSError, AttributeError):
    _madvise = None


def _file_mapping(address):
    """(lo, hi) of the mapping of a regular file holding `address`, or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo > address:          # the lines are in address order: no mapping holds it
                    return None
                if address < hi:
                    path = parts[5].strip() if len(parts) == 6 else ""
                    regular = path.startswith("/") and not path.startswith(("/dev/", "/memfd:", "/SYSV")) \
                        and not path.endswith("(deleted)")
                    return (lo, hi) if regular else None
    except OSError:
        return None
    return None


def drop(address, nbytes):
    """Drop the whole pages of [address, address + nbytes) that lie in a file mapping."""
    if _madvise is None or _MADV_DONTNEED is None or nbytes <= 0:
        return
    mapping = _file_mapping(address)
    if mapping is None:
        return
    lo = max(-(-address // _PAGE) * _PAGE, mapping[0])
    hi = min((address + nbytes) // _PAGE * _PAGE, mapping[1])
    if hi > lo:
        _madvise(lo, hi - lo, _MADV_DONTNEED)
