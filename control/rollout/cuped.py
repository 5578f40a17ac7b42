"""CUPED-style variance reduction for the rollout's CTR test: each user's vouched CTR before
the rollout started is the covariate.

With a fixed population of users, the users each arm draws differ in their own click rates
by chance, and more time never removes that difference (``control.rollout.planner``). Their
click-through rate before the rollout predicts it: the arms' difference is adjusted by
``theta * (covariate difference)``, ``theta`` estimated pooled over both arms' user clusters.
The covariate is read only from events logged before the rollout's start cursor, so the
treatment cannot move it and the adjusted difference estimates the same effect.

Pieces: ``read_pre_period`` (the streams before the start, one pass), ``Covariates`` (the
pre-period of the users each arm has served, per user cluster), ``cuped_difference`` (the
adjusted estimate and its clustered variance, pure) and ``mixture_on_estimate`` (the
always-valid test on it). Design note: docs/continuous-training.md, "Variance reduction".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, Field, PrivateAttr

from control.rollout.sequential import half_width
from services.events.attribution import SERVED
from services.stores.base import OnlineStore, stream_id_key

READ_BATCH = 10_000
Value = float | int | None


@dataclass(frozen=True)
class CupedArm:
    """One arm per unit (user cluster): in-rollout clicks and items shown, and the
    pre-period clicks and items shown of the users the arm served in that unit."""

    clicks: tuple[int, ...]
    impressions: tuple[int, ...]
    pre_clicks: tuple[int, ...]
    pre_impressions: tuple[int, ...]

    def __post_init__(self) -> None:
        sizes = {len(self.clicks), len(self.impressions)}
        sizes |= {len(self.pre_clicks), len(self.pre_impressions)}
        if len(sizes) != 1:
            raise ValueError("CupedArm's four per-unit tuples must have the same length")


@dataclass(frozen=True)
class CupedEstimate:
    """The adjusted CTR difference (canary - control) and its variance, beside the raw ones."""

    difference: float
    variance: float
    theta: float
    raw_difference: float
    raw_variance: float
    covariate_difference: float

    @property
    def variance_reduction(self) -> float:
        """1 - adjusted / raw variance (0: the covariate explained nothing)."""
        return 1.0 - self.variance / self.raw_variance if self.raw_variance > 0 else 0.0


def _linearised(arm: CupedArm) -> tuple[np.ndarray, np.ndarray, float, float, int] | None:
    """Per unit with any rollout impressions: the ratio's and the covariate's linearised
    contributions ``(x_k - R n_k) / N`` (delta method), R, the covariate ratio, K."""
    n = np.asarray(arm.impressions, np.float64)
    x = np.minimum(np.asarray(arm.clicks, np.float64), n)
    pn = np.asarray(arm.pre_impressions, np.float64)
    px = np.minimum(np.asarray(arm.pre_clicks, np.float64), pn)
    used = n > 0
    k, total = int(used.sum()), float(n.sum())
    if k < 2 or total <= 0:
        return None
    ratio = float(x.sum()) / total
    phi = (x[used] - ratio * n[used]) / total
    pre_total = float(pn[used].sum())
    pre_ratio = float(px[used].sum()) / pre_total if pre_total > 0 else 0.0
    psi = (px[used] - pre_ratio * pn[used]) / pre_total if pre_total > 0 else np.zeros(k)
    return phi, psi, ratio, pre_ratio, k


def cuped_difference(
    control: CupedArm, canary: CupedArm, theta: float | None = None
) -> CupedEstimate | None:
    """The canary's CTR minus production's, less ``theta`` times the same difference of
    their users' pre-period CTRs; ``theta`` (None) minimises the adjusted variance over both
    arms' units together (pooled), or is the number given (fixed: not fitted on the clusters
    it adjusts). Each arm's variance is the cluster-robust one of
    ``control.rollout.state.cluster_ratio_variance``, on the adjusted contributions.

    None when an arm has fewer than two units with rollout impressions, or when neither arm
    has pre-period data (nothing to adjust by: the caller uses the unadjusted test)."""
    arms = [_linearised(control), _linearised(canary)]
    if arms[0] is None or arms[1] is None:
        return None
    (phi0, psi0, r0, c0, k0), (phi1, psi1, r1, c1, k1) = arms[0], arms[1]
    scale0, scale1 = k0 / (k0 - 1), k1 / (k1 - 1)
    covariance = scale0 * float(phi0 @ psi0) + scale1 * float(phi1 @ psi1)
    spread = scale0 * float(psi0 @ psi0) + scale1 * float(psi1 @ psi1)
    raw_variance = scale0 * float(phi0 @ phi0) + scale1 * float(phi1 @ phi1)
    if spread <= 0.0:
        return None
    if theta is None:
        theta = covariance / spread
    # = the clustered sum of (phi - theta psi)^2 over both arms
    variance = max(0.0, raw_variance - 2 * theta * covariance + theta * theta * spread)
    covariate_difference = c1 - c0
    return CupedEstimate(
        difference=(r1 - r0) - theta * covariate_difference,
        variance=variance,
        theta=theta,
        raw_difference=r1 - r0,
        raw_variance=raw_variance,
        covariate_difference=covariate_difference,
    )


def mixture_on_estimate(difference: float, variance: float, tau: float, alpha: float) -> dict:
    """The normal-mixture SPRT of ``control.rollout.sequential.mixture_test`` on an estimate
    given directly (difference, variance): its log likelihood ratio, always-valid p and
    confidence sequence, under the same keys."""
    s2, t2 = max(variance, 1e-300), tau * tau
    log_lr = 0.5 * math.log(s2 / (s2 + t2)) + t2 * difference * difference / (2 * s2 * (s2 + t2))
    half = half_width(s2, tau, alpha)
    return {
        "difference": difference,
        "variance": s2,
        "tau": tau,
        "log_likelihood_ratio": log_lr,
        "likelihood_ratio": math.exp(min(log_lr, 700.0)),
        "p_value": min(1.0, math.exp(-log_lr)),
        "cs_lower": difference - half,
        "cs_upper": difference + half,
    }


def explained_share(user_variance: float, ctr: float, pre_items_per_user: float) -> float:
    """The share of the users' spread of click rates their pre-period CTR explains: the
    reliability ``s2 / (s2 + p (1 - p) / n)`` of a user's CTR over ``n`` items shown."""
    if user_variance <= 0.0 or pre_items_per_user <= 0.0:
        return 0.0
    noise = ctr * (1.0 - ctr) / pre_items_per_user
    return user_variance / (user_variance + noise)


class Covariates(BaseModel):
    """Pre-period counts per user, and their sums per arm and user cluster over the users
    each arm has served so far (a user is added to an arm once, at their first answer)."""

    pre: dict[str, list[int]] = Field(default_factory=dict, exclude=True)
    """user -> [vouched clicks, items shown] before the rollout's start (not saved: it can
    be large, and ``read_pre_period`` reads it again from the streams)."""
    seen: dict[str, list[str]] = Field(default_factory=dict)
    """arm -> users it has served."""
    sums: dict[str, list[list[int]]] = Field(default_factory=dict)
    """arm -> [pre clicks per cluster, pre items shown per cluster]."""
    clusters: int = 128
    _seen: dict[str, set[str]] = PrivateAttr(default_factory=dict)

    def see(self, arm: str, user_id: str, cluster: int) -> None:
        """``arm`` served ``user_id`` (in user cluster ``cluster``): add their pre-period."""
        if arm not in self._seen:
            self._seen[arm] = set(self.seen.get(arm, []))
        if user_id in self._seen[arm]:
            return
        self._seen[arm].add(user_id)
        self.seen.setdefault(arm, []).append(user_id)
        clicks, shown = self.pre.get(user_id, (0, 0))
        sums = self.sums.setdefault(arm, [[0] * self.clusters, [0] * self.clusters])
        sums[0][cluster] += clicks
        sums[1][cluster] += shown

    def arm(self, arm: str, clicks: list[int], impressions: list[int]) -> CupedArm | None:
        """The arm's units: its rollout clicks and impressions per cluster (``ArmCounts``'
        clusters) beside its users' pre-period sums; None without any pre-period data."""
        if not self.pre:
            return None
        sums = self.sums.get(arm, [[0] * self.clusters, [0] * self.clusters])
        return CupedArm(tuple(clicks), tuple(impressions), tuple(sums[0]), tuple(sums[1]))


async def read_pre_period(store: OnlineStore, start_cursor: str, window_s: float) -> dict:
    """Per user, [vouched clicks, items shown] logged in the ``window_s`` seconds before
    ``start_cursor`` (the rollout's first stream id, ``"<ms>-0"``), every version: events at
    or after the start are never read, so the treatment cannot reach the covariate."""
    end = stream_id_key(start_cursor)
    first = f"{max(0, end[0] - int(window_s * 1000))}-0"
    pre: dict[str, list[int]] = {}
    for stream in ("impressions", "feedback"):
        cursor = first
        while True:
            entries = await store.read_stream(stream, cursor, READ_BATCH)
            done = len(entries) < READ_BATCH
            for stream_id, fields in entries:
                if stream_id_key(stream_id) > end:
                    done = True
                    break
                cursor = stream_id
                user = fields.get("user_id", "")
                if stream == "impressions":
                    pre.setdefault(user, [0, 0])[1] += len(fields.get("items", "").split())
                elif fields.get("type") == "click" and fields.get("trust") == SERVED:
                    pre.setdefault(user, [0, 0])[0] += 1
            if done:
                break
    return pre
