"""One libcst codemod per fixable remote-code finding, applied in this order.

Each codemod reads the *current* code with hfcheck's ``ast`` index (``analyzer/remote``: which
class is the base model, the decoder layer, the attention, the config) and edits it with
libcst, so comments, blank lines and formatting outside the rewritten statements stay as
they were. A codemod records a ``Change`` per edit (finding code, where, what, why) and a
``Refusal`` for what it recognises but cannot rewrite safely; it never guesses.

Order matters: attention first (it removes direct flash/SDPA calls, so the import clean-up
that follows can drop the imports they needed), then the removed v4 APIs and unguarded
imports, the `.cuda()` calls the loader makes needless, config key aliases v5 reads, the 4.x config
attributes and rope_scaling value v5 no longer gives, the tied parameters v5 ties only when declared, the
``post_init()`` v5's loader needs, ``layer_idx``, ``**kwargs`` (the attention call added first needs them), projection helpers inlined for the
qkv fusion, the backend
flag (only once every attention module dispatches), the fused q/k/v split, the experts, the
decoder-layer lists, the v5 buffer initialisation, and last the parallel plans, read off the final module structure.
"""

from __future__ import annotations

from hfcheck.porter.rewrite.codemods.attention import AttentionInterface
from hfcheck.porter.rewrite.codemods.backend_flag import BackendFlag
from hfcheck.porter.rewrite.codemods.buffers import BufferInit
from hfcheck.porter.rewrite.codemods.config_aliases import ConfigAliases
from hfcheck.porter.rewrite.codemods.config_v4 import DroppedConfigDefaults, LegacyRopeScaling
from hfcheck.porter.rewrite.codemods.device_placement import DevicePlacement
from hfcheck.porter.rewrite.codemods.experts import ExpertsLayout
from hfcheck.porter.rewrite.codemods.generation import GenerationBase, TupleCache
from hfcheck.porter.rewrite.codemods.kwargs import KwargsPropagation
from hfcheck.porter.rewrite.codemods.layer_idx import LayerIndex
from hfcheck.porter.rewrite.codemods.module_lists import SingleLayerList
from hfcheck.porter.rewrite.codemods.packed_qkv import PackedQKV
from hfcheck.porter.rewrite.codemods.plans import ParallelPlans
from hfcheck.porter.rewrite.codemods.post_init import PostInit
from hfcheck.porter.rewrite.codemods.projections import ActivationModule, InlineProjectionHelpers
from hfcheck.porter.rewrite.codemods.removed_apis import HeadMask, RemovedApis
from hfcheck.porter.rewrite.codemods.rotary_positions import RotaryPositions
from hfcheck.porter.rewrite.codemods.tied_weights import TiedWeights

CODEMODS = (
    AttentionInterface,
    RemovedApis,
    HeadMask,
    DevicePlacement,
    ConfigAliases,
    DroppedConfigDefaults,
    LegacyRopeScaling,
    TiedWeights,
    PostInit,
    GenerationBase,
    TupleCache,
    RotaryPositions,
    LayerIndex,
    KwargsPropagation,
    InlineProjectionHelpers,
    ActivationModule,
    BackendFlag,
    PackedQKV,
    ExpertsLayout,
    SingleLayerList,
    BufferInit,
    ParallelPlans,
)

__all__ = ["CODEMODS"]
