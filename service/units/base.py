"""The `Unit` interface: one seed-batched layer of a neural arithmetic model.

Every parameter carries the seed dimension first (``[S, out, in]``) and the forward maps
``x [S, B, in] -> z [S, B, out]``, so one forward/backward trains S independent seeds.
Nothing in a unit mixes seeds: reductions are over the trailing dimensions only.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator, Literal, Sequence

import torch
from torch import Tensor, nn

from service.seeding.init_stream import InitStream
from service.units.init import InitSpec, parse_init
from service.units.options import UnitOptions


@contextmanager
def _on_host(module: nn.Module) -> Iterator[None]:
    """Let CPU generators fill a module whose tensors live on a GPU: the tensors are
    swapped for host copies inside the block and copied back into the *same* device
    storage after it (the optimiser's state and compiled graphs keep pointing at it).
    Drawing the initialisation on the host also makes it identical on every device."""
    tensors = [t for t in (*module.parameters(), *module.buffers()) if t.device.type != "cpu"]
    originals = [t.data for t in tensors]
    for t, orig in zip(tensors, originals):
        t.data = orig.cpu()
    try:
        yield
    finally:
        for t, orig in zip(tensors, originals):
            orig.copy_(t.data)
            t.data = orig


@dataclass(frozen=True)
class ForwardContext:
    """What a forward may need beyond ``x``: the training step (0-d int64 tensor, for
    temperature schedules) and per-seed noise keys ``[S]`` (for Gumbel gates)."""

    step: Tensor
    noise_keys: Tensor | None = None


ExactMode = Literal["add", "mul"]


class _MeanDistanceToBounds(torch.autograd.Function):
    """Per-seed ``mean(min(|a|, |1 − a|))`` over the trailing dimensions: the reference
    code's form of the NAU/NMU sparsity regulariser (NAU: ``a = |W|``, NMU: ``a = W``), with
    exactly the gradient autograd gives that formula, computed in a few operations instead
    of the ~12 of ``mean`` ∘ ``minimum`` ∘ ``abs`` ∘ ``rsub``.

    That gradient is ``sign(a)/n`` where ``|a| < |1 − a|``, ``−sign(1 − a)/n`` where
    ``|a| > |1 − a|`` and their half-sum at the tie ``a = 1/2`` (``minimum`` splits the
    gradient evenly between two equal inputs), so 0 at ``a = 1/2`` and, as ``abs'(0) = 0``,
    0 at the bounds ``a = 0`` and ``a = 1``: a weight sitting on its bound is not pushed
    outward (against the clamp). ``min(a, 1 − a)``, equal in value on [0, 1], would have
    ``±1/n`` there and part trajectories from the reference once weights reach a bound."""

    @staticmethod
    def forward(ctx, a: Tensor) -> Tensor:
        b = 1 - a
        ctx.save_for_backward(a, b)
        return torch.minimum(a.abs(), b.abs()).flatten(1).mean(1)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        a, b = ctx.saved_tensors
        n = a[0].numel()
        # d = sign(|b| − |a|): 1 where |a| is the minimum, −1 where |b| is, 0 at the tie
        # (IEEE subtraction is 0 only for equal operands); all factors below are exact
        d = torch.sign(b.abs() - a.abs())
        local = 0.5 * ((1 + d) * torch.sign(a) - (1 - d) * torch.sign(b))
        return (g / n).view(-1, *([1] * (a.dim() - 1))) * local


def mean_distance_to_bounds(a: Tensor) -> Tensor:
    """``min(|a|, |1 − a|).flatten(1).mean(1)`` (the NAU/NMU sparsity regulariser, ``[S]``)."""
    return _MeanDistanceToBounds.apply(a)


class Unit(nn.Module):
    """Base class. Subclasses set ``name`` and ``Options`` and implement the abstract hooks."""

    name: ClassVar[str]
    Options: ClassVar[type[UnitOptions]] = UnitOptions
    noise_stream: int = 0
    """Noise stream of a stochastic unit (the Gumbel gate): give each layer of a model its
    own (e.g. its index) so that two layers never draw the same noise."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_seeds: int,
        options: UnitOptions | None = None,
        init: InitSpec | str = "default",
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.num_seeds = num_seeds
        self.options = options if options is not None else self.Options()
        self.init = parse_init(init) if isinstance(init, str) else init
        # per seed (a packed run): options and initialisations of one structure whose
        # `Options.PACKABLE` and uniform bounds may differ; None: ``options``/``init`` for all
        self.seed_options: tuple[UnitOptions, ...] | None = None
        self.seed_inits: tuple[InitSpec, ...] | None = None

    def set_seed_variants(self, options: Sequence[UnitOptions], inits: Sequence[InitSpec]) -> None:
        """Give each seed its own options and initialisation (one per seed, all of this
        unit's structure). Units whose forward reads an `Options.PACKABLE` field build their
        per-seed tensors here (`on_seed_variants`), on the parameters' device."""
        if len(options) != self.num_seeds or len(inits) != self.num_seeds:
            raise ValueError(f"{len(options)} options / {len(inits)} inits for {self.num_seeds} seeds")
        self.seed_options, self.seed_inits = tuple(options), tuple(inits)
        self.on_seed_variants()

    def on_seed_variants(self) -> None:
        """Hook: build per-seed tensors from `seed_options` (nothing by default)."""

    def seed_rows(self, field: str, value=None) -> Tensor:
        """``[S]`` float32 of an option per seed (``value(options)`` if given), on the
        parameters' device: each Python number rounded once to float32."""
        options = self.seed_options or (self.options,) * self.num_seeds
        p = next(self.parameters(), None)
        rows = [value(o) if value is not None else getattr(o, field) for o in options]
        return torch.tensor(rows, dtype=torch.float64).to(p.device if p is not None else None, torch.float32)

    @contextmanager
    def _seed_view(self, k: int) -> Iterator[None]:
        """``options`` and ``init`` are seed ``k``'s inside the block (initialising it)."""
        if self.seed_options is None or self.seed_inits is None:
            yield
            return
        shared = self.options, self.init
        self.options, self.init = self.seed_options[k], self.seed_inits[k]
        try:
            yield
        finally:
            self.options, self.init = shared

    # -- parameters -------------------------------------------------------------------
    def seed_parameter(self, *shape: int) -> nn.Parameter:
        """A zero parameter of shape ``[S, *shape]`` (filled by `reset_parameters`)."""
        return nn.Parameter(torch.zeros(self.num_seeds, *shape))

    def reset_parameters(
        self, generators: Sequence[InitStream], seeds: Sequence[int] | None = None
    ) -> None:
        """Re-draw the parameters of the batch positions ``seeds`` (default: all), using
        ``generators[k]`` for position k, so every seed has its own init stream."""
        positions = range(self.num_seeds) if seeds is None else seeds
        with torch.no_grad(), _on_host(self):
            for k in positions:
                with self._seed_view(k):
                    self.init_seed_(k, generators[k])

    def init_seed_(self, k: int, generator: InitStream) -> None:
        """Fill the parameters of batch position ``k`` from ``generator``."""
        raise NotImplementedError

    def fill_weight_(
        self,
        w: Tensor,
        generator: InitStream,
        default: Callable[[Tensor, InitStream], object],
    ) -> None:
        """Fill one seed's ``[out, in]`` weight slice: the unit's reference ``default`` when
        ``self.init`` is 'default', else the configured `InitSpec`."""
        if self.init.kind == "default":
            default(w, generator)
        else:
            self.init.fill_(w, generator)

    # -- the maths ----------------------------------------------------------------------
    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:  # noqa: D102
        raise NotImplementedError

    def input_product_weight(self) -> Tensor | None:
        """``W`` when this unit's forward is exactly ``linear_forward(x, W)`` and nothing else
        (a trainer may then draw the batch and apply the layer in one pass,
        `service.units.sampled_linear`), else None."""
        return None

    def regularizer(self) -> Tensor:
        """Sparsity regulariser R per seed ``[S]`` (a mean over the unit's weights)."""
        return self._zeros()

    def oob_penalty(self) -> Tensor:
        """Penalty for weights outside their valid range, per seed ``[S]``."""
        return self._zeros()

    def sparsity_error(self) -> Tensor:
        """``max_w min(|w|, |1 - |w||)`` over the unit's effective weights, per seed ``[S]``."""
        mats = list(self.weight_matrices().values())
        if not mats:
            return self._zeros()
        errs = [torch.minimum(w.abs(), (1 - w.abs()).abs()).flatten(1).amax(1) for w in mats]
        return torch.stack(errs).amax(0)

    def clamp_(self) -> None:
        """Project parameters back into their constraint set (after each optimiser step)."""

    def weight_matrices(self) -> dict[str, Tensor]:
        """The effective weight matrices ``[S, out, in]`` (for sparsity and reports)."""
        return {}

    def load_exact_(self, weights: Tensor, mode: ExactMode) -> None:
        """Set every seed to an exact solution: ``z = W x`` (``add``) or
        ``z_o = prod_i x_i ** W_oi`` (``mul``), ``W`` given as ``[out, in]``.
        Raises ``NotImplementedError`` for a mode the unit cannot represent."""
        raise NotImplementedError(f"unit {self.name!r} cannot represent mode {mode!r}")

    def step_of(self, ctx: ForwardContext | None, device: torch.device) -> Tensor:
        """The training step as a 0-d int64 tensor (step 0 when there is no context)."""
        if ctx is None:
            return torch.zeros((), dtype=torch.int64, device=device)
        return ctx.step

    def _zeros(self) -> Tensor:
        p = next(self.parameters(), None)
        device = p.device if p is not None else None
        return torch.zeros(self.num_seeds, device=device, dtype=p.dtype if p is not None else None)
