"""The input formats a build reads, each behind one interface (source.py: a Source and its
Checkpoint), so the pipeline and the architectures never ask which format they read.

- read.py: `read_input`, which format a folder or file holds, as its Source.
- safetensors.py: config.json and safetensors headers, checked as the safetensors library does;
  mapping.py maps a tensor's bytes only while it is written; trust.py refuses a link out of the folder.
- awq_gptq.py, fp8.py: pre-quantized safetensors, read exactly.
- gguf/: llama.cpp's GGUF files, their config, tensors, quantized blocks and tokenizer.
- lora.py: a PEFT LoRA adapter merged into any source's checkpoint.

Nothing is imported here. What the write-time machinery shares with the formats, giving back a
mapped array's pages, is builder/mapped_pages.py, below both.
"""
