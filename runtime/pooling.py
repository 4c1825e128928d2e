"""Run real vLLM's pooling runner on small encoder folders and record what it did next to
hfcheck's prediction for the same folder.

Runs inside vLLM's environment like ``batch`` (``python -m hfcheck.runtime.pooling JOB``).
For each encoder type (``pooling:<model_type>``): its default config cut like the analyzer's
instance (head_dim 32 for the CPU kernels), built as its base model (``<X>Model``, which vLLM
serves as ``TransformersEmbeddingModel``) with random float32 weights; hfcheck's scan of the
folder; ``vllm.LLM(..., runner="pooling")`` embedding fixed token ids; and the embedding
transformers computes for the same ids with vLLM's default pooling for the class (the first
token, CLS, L2-normalised). The embeddings agree when their cosine is at least ``COSINE``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hfcheck.runtime.batch import PROMPT, attempt, build_and_predict, job_loop, vllm_engine
from hfcheck.runtime.decisions import differences
from hfcheck.runtime.tiny_vlm import word_tokenizer

COSINE = 0.9999


def cases() -> list[str]:
    """Every encoder type of the pooling atlas section (``pooling:<model_type>``), as hfcheck's
    transformers lists them: a type the vLLM environment's older transformers lacks is a
    ``no-instance`` row that says so, not a type left out."""
    from hfcheck.analyzer.sources.model_types import POOLING, atlas_types

    return [t.key for t in atlas_types() if t.section == POOLING]


def expected_embedding(model: Any, ids: list[int]) -> list[float]:
    """CLS pooling, normalised: what vLLM's embedding pooler returns for the class by default."""
    import torch

    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0, 0]
    return torch.nn.functional.normalize(hidden, dim=-1).tolist()


def run_case(key: str, work: Path) -> dict[str, Any]:
    import torch

    from hfcheck.analyzer.sources.model_types import POOLING, POOLING_PREFIX

    model_type = key.removeprefix(POOLING_PREFIX)
    folder = work / model_type
    row: dict[str, Any] = {"model_type": key, "section": "pooling"}
    t0 = time.perf_counter()
    built = build_and_predict(model_type, folder, row, POOLING)
    if built is None:
        return row
    model, want = built
    word_tokenizer().save_pretrained(folder)  # vLLM's pooling runner wants a tokenizer even for token-id prompts
    vocab = model.get_input_embeddings().weight.shape[0]  # I-BERT's QuantEmbedding has no num_embeddings
    ids = [t % vocab for t in PROMPT]
    log_path = work / f"{model_type}.log"

    def run() -> list[float]:
        from vllm.inputs import TokensPrompt

        with vllm_engine(log_path, model=str(folder), runner="pooling", max_model_len=64) as engine:
            (out,) = engine.embed([TokensPrompt(prompt_token_ids=ids)])
            return list(out.outputs.embedding)

    embedding, got = attempt(row, log_path, run)
    if embedding is not None:
        row["differences"] = differences(got, want)
        expected = torch.tensor(expected_embedding(model, ids))
        cosine = float(torch.nn.functional.cosine_similarity(torch.tensor(embedding), expected, dim=0))
        row.update(cosine=round(cosine, 6), dims=len(embedding), tokens_match=cosine >= COSINE)
        if not cosine >= COSINE:  # NaN too: an uninitialised layer can make vLLM's embedding NaN
            row["wrong_output"] = f"embedding cosine {cosine:.4f} to transformers'"
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def main() -> None:
    job_loop(run_case, {"section": "pooling"})


if __name__ == "__main__":
    main()
