"""GGUF files (llama.cpp's format) read as a Source: a Checkpoint of Hugging Face tensor names and
lazy weights (checkpoint.py), the config.json that the file's metadata implies (metadata.py), and
the tokenizer.json it carries (tokenizer.py, sentencepiece.py).

header.py reads the header (metadata, tensor names, types, shapes and offsets), every count
checked against the file's size; each tensor's bytes are then mapped only while it is written,
like a safetensors slice. The metadata config.json is made from is checked for type and range, the
layer count against the tensors present, before anything is sized by it. Names follow
llama.cpp's (`blk.3.attn_q.weight`) and are mapped back (names.py) to transformers' (`model.layers.3.self_attn.
q_proj.weight`), undoing what llama.cpp's converter (convert_hf_to_gguf.py) changed on the way in:
Llama's q/k rows permuted for its rotary layout (transformers' LlamaTensorProcessor reverses it the
same way, modeling_gguf_pytorch_utils.py); Gemma's norm weights stored as 1 + weight (its converter
folds Gemma's RMSNorm offset in; transformers' Gemma2TensorProcessor subtracts 1 again, as here).
Per family, some names differ: Gemma 2/3's sandwich norms (`post_attention_norm`, `ffn_norm` before
the MLP, `post_ffw_norm`), Phi-3's fused `attn_qkv` and `ffn_up` (gate rows, then up rows).

Rotary scaling that llama.cpp's converter stores as tensors (ROPE_TENSORS) is read into the config:
Llama 3.1/3.2's llama3 scaling as per-frequency factors (`rope_freqs`: each frequency divided by its
factor, as llama.cpp's rope does; transformers' GGUF loader skips it and builds the plain rotary),
Phi-3's LongRoPE long/short factors.

Tensor types: F32, F16 and BF16 are float weights. Q4_0, Q8_0, Q4_1, Q5_0, Q5_1 and the K-quants
Q2_K..Q6_K are written into MatMulNBits value for value by a quantized build (blocks.py:
4- or 8-bit codes, blocks of 32 or 16, the minimums of Q4_1, Q5_1, Q2_K, Q4_K and Q5_K as per-block
offsets), nothing re-quantized; a float build dequantizes them (gguf.quants, the same numbers
transformers loads). Any other type is refused by name.
Decided: an int4 build of a Q8_0 tensor keeps its 8-bit blocks (8-bit MatMulNBits, lossless; 32 code
bytes and a scale per 32 values against int4's 16 and a scale, 1.8-1.9 times the bytes) rather than
rounding them again to 4 bits, which would stack a second rounding on the first; a user who wants
int4 sizes builds from the float checkpoint, where int4 rounds the original weights once.
"""
