"""Hugging Face Llama weights on disk, written and read with nothing but struct/json/numpy.

safetensors layout (https://huggingface.co/docs/safetensors): 8 bytes little-endian u64 N, then N
bytes of JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}
(offsets relative to the end of the header), then the raw little-endian tensor bytes. Deliberately
independent of the `safetensors` package so the tests check mxtrain against the spec, not against
another implementation's quirks.
"""
import json
import os
import struct

import numpy as np

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "U16": np.uint16,
    "U32": np.uint32,
    "U64": np.uint64,
    "BOOL": np.bool_,
}
_NAMES = {np.dtype(v).str: k for k, v in _DTYPES.items()}


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: numpy array}. Written in name order, header padded to 8 bytes."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        dtype = _NAMES[np.dtype(arr.dtype).str]
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for raw in blobs:
            f.write(raw)


def read_safetensors(path):
    """Returns {name: numpy array}; checks the offsets cover the data region exactly."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8:8 + n].decode())
    body = data[8 + n:]
    out = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<")
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * dtype.itemsize or end > len(body):
            raise ValueError(f"{path}: tensor {name} has inconsistent offsets")
        out[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(shape).astype(
            dtype.newbyteorder("="))
        spans.append((begin, end))
    spans.sort()
    pos = 0
    for begin, end in spans:
        if begin != pos:
            raise ValueError(f"{path}: tensor data has a gap or overlap at byte {begin}")
        pos = end
    if pos != len(body):
        raise ValueError(f"{path}: {len(body) - pos} trailing bytes after the last tensor")
    return out


def llama_config_dict(cfg):
    """cfg: dict with the HF field names (see llama_ref.LlamaShape). Returns config.json content."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": int(cfg["hidden_size"]),
        "intermediate_size": int(cfg["intermediate_size"]),
        "num_hidden_layers": int(cfg["num_hidden_layers"]),
        "num_attention_heads": int(cfg["num_attention_heads"]),
        "num_key_value_heads": int(cfg["num_key_value_heads"]),
        "head_dim": int(cfg["head_dim"]),
        "vocab_size": int(cfg["vocab_size"]),
        "rope_theta": float(cfg["rope_theta"]),
        "rms_norm_eps": float(cfg["rms_norm_eps"]),
        "tie_word_embeddings": bool(cfg["tie_word_embeddings"]),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 2048)),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def write_hf_dir(path, cfg, params):
    """Writes path/config.json and path/model.safetensors (F32). params: {HF name: array}."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(llama_config_dict(cfg), f, indent=2)
    write_safetensors(os.path.join(path, "model.safetensors"),
                      {k: np.asarray(v, dtype=np.float32) for k, v in params.items()},
                      metadata={"format": "pt"})


def read_hf_dir(path):
    """Returns (config dict, {HF name: array}) from path/config.json + path/model.safetensors."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    return cfg, read_safetensors(os.path.join(path, "model.safetensors"))


def read_checkpoint_weights(step_dir):
    """{hf_name: fp32 array} of an mxtrain checkpoint step (format 2), rebuilt here from the
    manifest and every rank file's `master.<unit>` slice, independently of mxtrain's reader."""
    import json
    import os
    m = json.load(open(os.path.join(step_dir, "manifest.json")))
    assert m["format_version"] == 2, m["format_version"]
    files = {s["shard_rank"]: read_safetensors(os.path.join(step_dir, s["file"]))
             for s in m["shards"]}
    out = {}
    for ui, u in enumerate(m["units"]):
        flat = np.zeros(u["numel"], dtype=np.float32)
        for s in m["shards"]:
            sl = [x for x in s["slices"] if x["unit"] == ui][0]
            if sl["end"] > sl["begin"]:
                flat[sl["begin"]:sl["end"]] = files[s["shard_rank"]]["master." + u["name"]]
        for t in u["tensors"]:
            n = int(np.prod(t["shape"]))
            out[t["name"]] = flat[t["offset"]:t["offset"] + n].reshape(t["shape"])
    return out
