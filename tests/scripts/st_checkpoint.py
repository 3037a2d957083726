"""A stabletrain checkpoint reader and the weight-slice layout, written from the file
format documented at the top of io/checkpoint.cpp and the layout of model/gpt2.h and
analysis/slices.h (not through stabletrain's C++), for the independent checks in this
folder (check_w1_scipy.py, check_spectral_numpy.py)."""
import hashlib
import struct

import numpy as np

# ---------------------------------------------------------------- checkpoint reader

MAGIC = b"STCKPT01"
TYPES = {1: "i32", 2: "i64", 3: "f32", 4: "f64", 5: "bytes", 6: "string"}


def read_checkpoint(path):
    """All records of a checkpoint as a dict; the SHA-256 trailer is verified."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 12 + 40 or data[:8] != MAGIC:
        raise ValueError(f"{path}: not a checkpoint")
    payload_len = struct.unpack_from("<Q", data, len(data) - 40)[0]
    if payload_len != len(data) - 40:
        raise ValueError(f"{path}: trailer payload length {payload_len} != {len(data) - 40}")
    digest = data[len(data) - 32:]
    if hashlib.sha256(data[: len(data) - 32]).digest() != digest:
        raise ValueError(f"{path}: SHA-256 mismatch")
    # Header, record and trailer layout are frozen across versions; later versions only add
    # records (version 2 added hooks_state), and this reader needs only the first ones.
    version = struct.unpack_from("<I", data, 8)[0]
    if version < 1:
        raise ValueError(f"{path}: version {version}")
    rec = {}
    pos = 12
    while pos < payload_len:
        (nl,) = struct.unpack_from("<H", data, pos)
        name = data[pos + 2 : pos + 2 + nl].decode("ascii")
        typ = data[pos + 2 + nl]
        (vl,) = struct.unpack_from("<Q", data, pos + 3 + nl)
        v = data[pos + 11 + nl : pos + 11 + nl + vl]
        pos += 11 + nl + vl
        t = TYPES[typ]
        if t == "i32":
            rec[name] = struct.unpack("<i", v)[0]
        elif t == "i64":
            rec[name] = struct.unpack("<q", v)[0]
        elif t == "f32":
            rec[name] = struct.unpack("<f", v)[0]
        elif t == "f64":
            rec[name] = struct.unpack("<d", v)[0]
        elif t == "string":
            rec[name] = v.decode("utf-8")
        else:
            rec[name] = v
    if pos != payload_len:
        raise ValueError(f"{path}: records overrun the payload")
    return rec


def master_weights(path):
    r = read_checkpoint(path)
    eb = r["master_elem_bytes"]
    dt = {4: "<f4", 8: "<f8"}[eb]
    flat = np.frombuffer(r["master"], dtype=dt).astype(np.float32)  # FP64 mode -> FP32
    shape = {k: r[k] for k in ("n_layer", "n_head", "n_embd", "max_seq_len", "vocab_size",
                               "padded_vocab_size")}
    return shape, r["step"], flat


# ---------------------------------------------------------------- layout

def param_arrays(shape, flat):
    """The parameter tensors of model/gpt2.h, in llm.c order, as views of `flat`."""
    L, C = shape["n_layer"], shape["n_embd"]
    Vp, T = shape["padded_vocab_size"], shape["max_seq_len"]
    shapes = [("wte", (Vp, C)), ("wpe", (T, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
              ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)),
              ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)),
              ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
              ("lnfw", (C,)), ("lnfb", (C,))]
    total = sum(int(np.prod(s)) for _, s in shapes)
    if total != flat.size:
        raise ValueError(f"{flat.size} master values, the shape needs {total}")
    out, off = {}, 0
    for name, s in shapes:
        n = int(np.prod(s))
        out[name] = flat[off : off + n].reshape(s)
        off += n
    return out


def slice_matrices(shape, flat):
    """{(tensor, layer, head): 2-D FP64 matrix} for every slice of analysis/slices.h."""
    p = param_arrays(shape, flat)
    L, H, C, V = shape["n_layer"], shape["n_head"], shape["n_embd"], shape["vocab_size"]
    hs = C // H
    out = {("wte", -1, -1): p["wte"][:V], ("wpe", -1, -1): p["wpe"],
           ("lnfw", -1, -1): p["lnfw"], ("lnfb", -1, -1): p["lnfb"]}
    for name in ("ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw",
                 "fcb", "fcprojw", "fcprojb"):
        for l in range(L):
            out[(name, l, -1)] = p[name][l]
    for l in range(L):
        for which, name in enumerate(("wq", "wk", "wv")):
            for h in range(H):
                r0 = which * C + h * hs
                out[(name, l, h)] = p["qkvw"][l][r0 : r0 + hs, :]
        for h in range(H):
            out[("wo", l, h)] = p["attprojw"][l][:, h * hs : (h + 1) * hs]
    return {k: np.atleast_2d(np.asarray(v, dtype=np.float64)) for k, v in out.items()}


def slices(shape, flat):
    """{(tensor, layer, head): values (FP64, 1-D)} for every slice of analysis/slices.h."""
    return {k: np.ascontiguousarray(v).ravel() for k, v in slice_matrices(shape, flat).items()}
