"""Python packages by where they can run: a table with no imports, which the analyzer's HFC812
check and the reference environments both read (the environments module itself needs POSIX file
locks and pip, which a scan has no use for)."""

# Import names of packages with CUDA/GPU kernels -> what they are. Never installable on a CPU
# machine; remote code importing one unconditionally does not load there (HFC812).
CUDA_ONLY = {
    "flash_attn": "flash-attention (CUDA kernels)",
    "flash_attn_2_cuda": "flash-attention (CUDA kernels)",
    "flash_attn_interface": "flash-attention 3 (Hopper CUDA kernels)",
    "xformers": "xformers (CUDA kernels)",
    "mamba_ssm": "mamba-ssm (CUDA kernels)",
    "causal_conv1d": "causal-conv1d (CUDA kernels)",
    "selective_scan_cuda": "mamba selective scan (CUDA kernel)",
    "fla": "flash-linear-attention (Triton GPU kernels)",
    "triton": "Triton (GPU kernels)",
    "triton_pre_mlir": "Triton, MosaicML's pre-MLIR fork (GPU kernels)",
    "apex": "NVIDIA apex (CUDA kernels)",
    "fused_dense_lib": "flash-attention fused dense (CUDA)",
    "rotary_emb": "flash-attention rotary (CUDA)",
    "dropout_layer_norm": "flash-attention layer norm (CUDA)",
    "flashinfer": "FlashInfer (CUDA kernels)",
    "transformer_engine": "Transformer Engine (CUDA)",
    "deep_gemm": "DeepGEMM (CUDA)",
    "megablocks": "MegaBlocks (CUDA)",
    "grouped_gemm": "grouped_gemm (CUDA)",
    "cupy": "CuPy (CUDA)",
    "pycuda": "PyCUDA (CUDA)",
    "liger_kernel": "Liger kernels (Triton GPU)",
}
