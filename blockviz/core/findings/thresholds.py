"""Every threshold of the findings rules, each a named constant docs/findings.md's table quotes.

The calibration numbers beside them were measured on runs of this code (README's findings
table and BENCHMARKS.md, "Findings", name the configs). Torch-free.
"""

from __future__ import annotations

from blockviz.core.studies.outcomes import STALL_MARGIN

# A state rule must hold at this many probe steps in a row, ending at the newest.
PERSIST = 2
# diverged: a layer's gradient "grew" once its norm is this many times its first probe's.
GROWTH_FACTOR = 10.0
# stalled: the running median of the last STALL_WINDOW logged train losses has stayed at or
# above the unigram entropy minus STALL_MARGIN (the study outcome's margin, 0.1 nat) for at
# least STALL_MIN_STEPS steps, up to the newest. (A healthy baby-cpu run with its 100-step
# warm-up spends 39 steps there on its way down; the Post-LN starter every step since 6.)
STALL_WINDOW = 20
STALL_MIN_STEPS = 100
# A stall counts from where the median came within STALL_NEAR above the unigram entropy
# (when it ends there); its words say "at the unigram entropy" only within STALL_MARGIN of
# it, "above" beyond (tiny Pre-LN at lr 0.3: 3.37 against 3.25, 0.12 above).
STALL_NEAR = 0.5
# plateau: after the running median went below the unigram entropy minus STALL_MARGIN, it
# stays within PLATEAU_BELOW nats of it and the least-squares slope of the logged losses
# over the last PLATEAU_STEPS steps (at least PLATEAU_POINTS of them) falls by less than
# PLATEAU_FALL nats per 100 steps. Set on tiny runs (tests/finding_runs.py's and these, 400
# steps, seed 1337): on Tiny Shakespeare (H₁ 3.31) lr 0.1 constant flattened at 3.1–3.2
# from step 100 (slopes over 200 steps −0.06 to +0.06 from step 225, 0.07–0.2 nat below
# H₁), on pydocs (H₁ 3.25) the same at 3.1–3.15 (−0.07 to +0.03); with a cosine schedule
# the Shakespeare run still fell 0.05–0.22 per 100 steps, 0.29–0.42 nat below H₁, and lr
# 0.03 constant stopped 0.7 nat below: both left silent.
PLATEAU_STEPS = 200
PLATEAU_BELOW = 0.3
PLATEAU_FALL = 0.05
PLATEAU_POINTS = 10  # logged losses the slope needs in its window
# loss_spike: a logged train loss above SPIKE_FACTOR times the median of the SPIKE_WINDOW
# logged losses before it (as Lightning's SpikeDetection compares a loss with a running
# mean over a window; a median is not dragged up by the spike's neighbours). The largest
# ratio in a healthy 2,000-step baby-cpu run was 1.31.
SPIKE_WINDOW = 50
SPIKE_FACTOR = 1.5
# gradient_depth: first block's gradient norm / last block's beyond this either way.
# (Healthy baby-cpu: 0.7 to 2.0; the Post-LN starter: 1.6e-5; Pre-LN and ReLU at lr 3e-2 to
# 1e-1: 100 to 183 at some probes, mostly under 50.)
GRAD_DEPTH_RATIO = 100.0
# slow_updates: a block's weight matrices move less than UPDATE_LOW × lr of their norm per
# step. AdamW moves each weight by about lr·m̂/√v̂ plus lr·weight_decay·θ, so weight decay
# alone gives ‖Δθ‖/‖θ‖ = lr·weight_decay (0.1·lr at the default): a layer at about that
# level learns nothing from its gradient. (Healthy runs here: 1 to 9 × lr.)
UPDATE_LOW = 0.2
# stalled: the blocks' updates are normal-sized for the lr when every block's weight
# matrices move by at least UPDATE_NORMAL × lr of their norm per step (and none by more
# than UPDATE_HIGH) at the newest probe after step 0; then the suggestion is a higher lr,
# not a lower one. (Healthy tiny, quick and baby-cpu runs here: 1.6 to 9.7 × lr; tiny
# Pre-LN at lr 1e-5, stalled above the unigram entropy: 6.8 to 7.0 × lr; tiny Pre-LN at lr
# 0.3, stalled: 0.2 × lr and 0.06 of the norm.)
UPDATE_NORMAL = 1.0
# large_updates: ‖Δθ‖/‖θ‖ above this at a step other than step 0 (AdamW's first update
# moves every weight by exactly lr, whatever the gradient). Healthy runs here stay below
# 0.03; Pre-LN tiny at lr 0.3 reaches 0.09 while it stalls.
UPDATE_HIGH = 0.05
# dead_units: more than this fraction of a layer's FFN units zero on every probe token.
DEAD_FRAC = 0.25
# attention_collapse: every head of a layer below this mean entropy (nats).
ENTROPY_FLOOR = 0.1
# attention_logit_growth: a head's largest |logit| above this and at least LOGIT_GROWTH
# times its first probe's (healthy baby-cpu at lr 1e-3 over 2,000 steps: 28 at most, 24
# signed; a healthy tiny no-norm run with GPT-2 init, lr 3e-3: 43, its signed largest 4.6).
ATTN_LOGIT_MAX = 50.0
LOGIT_GROWTH = 10.0
# rank_collapse: the mean cosine similarity between positions at a block's output.
RANK_COS = 0.99
# residual_growth: the RMS of the stream leaving a block (resid_post) at least RESID_GROWTH
# times its first probe's and at least RESID_RMS. Measured here (300 steps probed every 10,
# the largest over the run): healthy tiny Pre-LN 4.8× (RMS 7.0), tiny Post-LN 1.3×, tiny
# no-norm 1.9×, tiny Xavier 3.2×, quick Pre-LN / Post-LN / no-norm 3.1× / 1.1× / 1.8×;
# baby-cpu at the defaults over 2,000 steps probed every 50: 2.6× (RMS 3.8). GPT-2 init
# starts the stream at RMS 0.03, so ratios mean little there: tiny Pre-LN 14× (RMS 0.39),
# tiny no-norm 200× (RMS 5.6), both healthy, hence RESID_RMS. The Pre-LN starter at lr
# 1e-2 (it trains; its attention logits grow to 168): 29× (RMS 43), left below the bound.
# Fired: tiny ReLU at lr 0.1, 230–480× (RMS 330–700) from step 10; tiny Pre-LN at lr 0.3,
# 900–3,800×; the tiny blow-up (no norms, no clipping, lr 0.3), 10⁶×.
RESID_GROWTH = 50.0
RESID_RMS = 20.0
# massive_activations: largest |activation| at least MASSIVE_RATIO times the median and at
# least MASSIVE_ABS in absolute value. Our reading of Sun et al. 2024, who report a few
# activations of large language models up to 100,000 times larger than the others; no
# run of this project has reached it (the largest ratio seen: 7,000, in a blow-up).
MASSIVE_RATIO = 1000.0
MASSIVE_ABS = 100.0
# output_logit_growth: largest |output logit| or |mean log Z| above these (healthy runs
# here: at most 16 and 11; Gemma 2 caps logits at 30).
OUTPUT_LOGIT_MAX = 100.0
LOG_Z_MAX = 50.0
# overfitting: the val loss has risen OVERFIT_RISE above its lowest evaluation and the
# val − train gap is larger than it was there (train: mean of the last OVERFIT_TRAIN
# logged losses up to each evaluation); needs OVERFIT_EVALS evaluations.
OVERFIT_RISE = 0.05
OVERFIT_TRAIN = 50
OVERFIT_EVALS = 3
# induction_heads: a head forms at the first probe of PERSIST in a row at which its
# prefix_score's lower bound, the score minus PREFIX_Z standard errors (prefix_score_se),
# is at or above PREFIX_THRESHOLD (or PREFIX_OVER_UNIFORM times the uniform-attention
# score of the run's repeated batch, where that is more: short contexts). A formed head
# stays formed (its step never moves) until its upper bound, the score plus PREFIX_Z
# standard errors, has been below PREFIX_RELEASE times the threshold at PREFIX_REVOKE
# probes in a row: one that settles near the threshold does not flip on noise (issue 39,
# defect 4). A head whose attention entropy on the probe batch is below ENTROPY_FLOOR at a
# probe has collapsed onto one position there: it counts as below, whatever it scores
# (defect 6). The runs the thresholds were chosen on and the held-out ones they were
# judged on: docs/findings.md, "Induction heads" (benchmarks/induction_runs.py). The loss
# bends there when the least-squares
# slope of the logged train loss over the BEND_WINDOW steps after that step is at least
# BEND_FACTOR times the slope over the BEND_WINDOW steps before it, or at most
# 1 / BEND_FACTOR of it, and the change is at least BEND_Z standard errors (each window
# needs BEND_MIN_POINTS logged losses).
PREFIX_THRESHOLD = 0.05
PREFIX_OVER_UNIFORM = 2.0
PREFIX_Z = 2.0
PREFIX_RELEASE = 0.5
PREFIX_REVOKE = 5
BEND_WINDOW = 250
BEND_FACTOR = 2.0
BEND_Z = 4.0
BEND_MIN_POINTS = 10

__all__ = [
    "ATTN_LOGIT_MAX",
    "BEND_FACTOR",
    "BEND_MIN_POINTS",
    "BEND_WINDOW",
    "BEND_Z",
    "DEAD_FRAC",
    "ENTROPY_FLOOR",
    "GRAD_DEPTH_RATIO",
    "GROWTH_FACTOR",
    "LOGIT_GROWTH",
    "LOG_Z_MAX",
    "MASSIVE_ABS",
    "MASSIVE_RATIO",
    "OUTPUT_LOGIT_MAX",
    "OVERFIT_EVALS",
    "OVERFIT_RISE",
    "OVERFIT_TRAIN",
    "PERSIST",
    "PLATEAU_BELOW",
    "PLATEAU_FALL",
    "PLATEAU_POINTS",
    "PLATEAU_STEPS",
    "PREFIX_OVER_UNIFORM",
    "PREFIX_RELEASE",
    "PREFIX_REVOKE",
    "PREFIX_THRESHOLD",
    "PREFIX_Z",
    "RANK_COS",
    "RESID_GROWTH",
    "RESID_RMS",
    "SPIKE_FACTOR",
    "SPIKE_WINDOW",
    "STALL_MARGIN",
    "STALL_MIN_STEPS",
    "STALL_NEAR",
    "STALL_WINDOW",
    "UPDATE_HIGH",
    "UPDATE_LOW",
    "UPDATE_NORMAL",
]
