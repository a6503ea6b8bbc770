#!/usr/bin/env bash
# The one script sent to the H200: GPU tests, then the benchmark; logs, JSON and PNG under $OUT.
# Usage: scripts/gpu_check.sh [STAGES] [extra bench options...]; or scripts/gpu_check.sh exec CMD... (CMD after the
# setup below: the wheels installed, the repo on PYTHONPATH, device.txt written); STAGES: comma list of
#   train,tests,curves,bench,profile or all (train: real CartPole training with every plan, tests/trainer/runtime/test_train.py)
#   round2 = bench-core,profile-bf16,bf16,bench-full (issue 14 in one call, ~550 s on one H200), in this order:
#     bench-core: every method on `core` (eager, compile, compile-bf16, graph, dual, fused, zerocopy,
#       zerocopy-bf16), 3 windows, no timer-overhead runs      -> $OUT/core/bench.{json,md,png}
#     profile-bf16: kernels per step of zerocopy-bf16 on `core`, by kind -> $OUT/profile_zerocopy_bf16_core.txt
#     bf16: the bf16 GPU equivalence tests (core 50 steps, 2000-step bf16 loss curves; the `full`
#       50-step test too with BF16_FULL=1)                     -> $OUT/gpu_tests_bf16.log, loss_curves-bf16.{json,png}
#     bench-full: `full` without the two torch.compile rows (96 s of compilation each); zerocopy-bf16
#       before fused and zerocopy, which share one compilation  -> $OUT/full/bench.{json,md,png}
#   round3 = bench3,profile3,bf16-core,bench3-full (issue 14 round 3, ~400 s with DEADLINE 420 s, its default here):
#     bench3: core: eager, compile, compile-bf16, fused, zerocopy, zerocopy-bf16, zerocopy-bf16+combo
#       (Inductor's combined kernels), 3 windows                -> $OUT/core/bench.{json,md,png}
#     profile3: kernels per step of zerocopy-bf16 and zerocopy-bf16+combo on `core`
#                                                               -> $OUT/profile_round3_core.txt
#     bf16-core: the core 50-step bf16 GPU equivalence test (fused bf16 against float32 eager, BF16_RTOL)
#                                                               -> $OUT/gpu_tests_bf16_core.log
#     bench3-full: `full`, compile-bf16 and zerocopy-bf16, in what time is left -> $OUT/full/bench.{json,md,png}
#   round3b = bench3b,profile3b,bf16-core (round 3 re-measured in ~280 s, DEADLINE 280 s, its default here):
#     bench3b: core: compile-bf16, zerocopy-bf16, zerocopy-bf16+combo, 3 windows -> $OUT/core/bench.{json,md,png}
#     profile3b: kernels per step of zerocopy-bf16+combo on `core` -> $OUT/profile_round3_core.txt
#   round4 = ab4,tests4,bench4,profile4 (issue 14 round 4, compiled sampling; DEADLINE 560 s, its default here):
#     ab4: compile-bf16 on `core` from the folders .ab/A and .ab/B (`git archive` exports of two commits,
#       carried), one child process each, alternating for AB_ROUNDS (1) rounds -> $OUT/ab/bench.{json,md}
#     tests4: the compiled replay ops against eager on the GPU (tests/trainer/execution/plans/test_replay_ops.py) and
#       the core 50-step bf16 equivalence test                      -> $OUT/gpu_tests_round4.log
#     bench4: core: compile-bf16, zerocopy-bf16, zerocopy-bf16+combo, 3 windows -> $OUT/core/bench.{json,md,png}
#     profile4: kernels per step of zerocopy-bf16+combo on `core` -> $OUT/profile_round4_core.txt
#   round5 = bench5,profile5 (issue 14 round 5; DEADLINE 570 s, its default here):
#     bench5: core: every method (eager, compile, compile-bf16, fused, zerocopy, zerocopy-bf16,
#       zerocopy-bf16+combo: each plan against the one before it), 3 windows, with the timer overhead of
#       eager and each zerocopy variant                          -> $OUT/core/bench.{json,md,png}
#     profile5: every kernel per step of zerocopy-bf16+combo on `core`, with and without split-K in the
#       bf16 products (+nosplitk), in one process              -> $OUT/profile_round5_core.txt
#   round5b = combo5,full5 (DEADLINE 580 s, its default here):
#     combo5: the compiled replay ops (GPU), the split-K scope, and the core bf16 equivalence test with
#       and without Inductor's combined kernels                 -> $OUT/gpu_tests_round5.log
#     full5: `full`, compile-bf16 and zerocopy-bf16+combo (two compilations of 110-225 s)
#                                                               -> $OUT/full/bench.{json,md,png}
#   round6 = ab6,profile6 (issue 14 round 6, DEADLINE 560 s, its default here):
#     ab6: zerocopy-bf16 on `core` from the folders .ab/A and .ab/B (carried `git archive` exports: before
#       and after the online and target networks' stacked pass in compute_targets, 680edf9 and its
#       successor), one child process each, alternating for AB_ROUNDS (1) rounds -> $OUT/ab/bench.{json,md}
#     profile6: every kernel per step of zerocopy-bf16+combo on `core` and on `full`, with each one's
#       timeline (Chrome trace format)                          -> $OUT/profile_round6_{core,full}.txt, $OUT/trace/
#   round7 = small7,tests7,bench7,profile7 (issue 14 round 7: the Triton window attention; DEADLINE 560 s):
#     small7: the attention's and C51 projection's ways of running, timed alone (scripts/bench_small_ops.py)
#                                                               -> $OUT/small_ops.txt
#     tests7: the window-attention kernels against SDPA (tests/trainer/execution/kernels, bf16 too) and the core bf16
#       equivalence test                                        -> $OUT/gpu_tests_round7.log
#     bench7: core: compile-bf16, zerocopy-bf16, zerocopy-bf16+combo, 3 windows -> $OUT/core/bench.{json,md,png}
#     profile7: every kernel of zerocopy-bf16+combo on `core`, with its timeline
#                                                               -> $OUT/profile_round7_core.txt, $OUT/trace/
#   round7b = full7,train: `full`, compile-bf16 and zerocopy-bf16+combo, and the train stage; the script runs
#     `train` first (its place below), which left too little for full7 on 2026-12-04: call full7 alone
#   round8 = full7,profile8 (DEADLINE 580 s): full7, then every kernel of zerocopy-bf16 on `full` without
#     combined kernels, whose Triton kernels keep their ops' names (`full`'s 245 µs reduction is one of
#     them), with its timeline                                  -> $OUT/profile_round8_full.txt, $OUT/trace/
#   round9 = code9: every kernel of zerocopy-bf16 on `core` without combined kernels, with its timeline and
#     Inductor's generated modules (each graph's `call` and Triton source), to name each kernel of the
#     profile                                  -> $OUT/profile_round9_core.txt, $OUT/trace/, $OUT/inductor_code.tgz
#   round10 = tests10,bench10,profile10,tests10b: the GPU tests of what round 10 changed (replay ops and
#     capture, graph = eager and zerocopy = eager on `core`, zerocopy K=10 training CartPole), then `core`
#     with compile-bf16, zerocopy-bf16 and zerocopy-bf16+combo, every kernel of the last with its timeline,
#     and last (its compilation mostly cached by then) fused bf16 with combined kernels = eager
#          -> $OUT/gpu_tests_round10.log, $OUT/core/, $OUT/profile_round10_core.txt, $OUT/gpu_tests_round10b.log
#   round11 = prof11,bench11: every kernel of zerocopy-bf16+combo on `core` with Inductor's default cap of 8
#     kernels per combined kernel and with 16 (`+combo16`), with their timelines and Inductor's generated
#     modules (each combined kernel's source names its parts); then `core` with every method but eager
#          -> $OUT/profile_round11_core.txt, $OUT/trace/, $OUT/inductor_code.tgz, $OUT/core/
#   round11b = full11: `full` with compile-bf16, zerocopy-bf16 and zerocopy-bf16+combo  -> $OUT/full/
#   round12 = tests12,prof12,bench12: the combined replay ops against eager (GPU), then every kernel of
#     zerocopy-bf16+combo on `core` (the replay's compiled work combined too), and with every combined
#     kernel kept (`+allcombo`), with their timelines;
#     then `core` with compile-bf16, zerocopy-bf16 and zerocopy-bf16+combo
#                     -> $OUT/gpu_tests_round12.log, $OUT/profile_round12_core.txt, $OUT/trace/, $OUT/core/
#   round12b = bench12b,full12: `core` with every method but eager, then `full` with compile-bf16 and
#     zerocopy-bf16+combo                                                         -> $OUT/core/, $OUT/full/
#   round13 = prof13: every kernel of zerocopy-bf16+combo on `core` with its timeline and Inductor's generated
#     modules, main's code before round 13's changes (DEADLINE 300 s)
#          -> $OUT/profile_round13_core.txt, $OUT/trace/, $OUT/inductor_code.tgz
#   round13b = tests13,prof13b: the spectral kernel's tests (GPU, Inductor too), the fused bf16 plan with
#     combined kernels = eager, dual = eager and zerocopy = eager on `core`, the dual plan's guard; then every kernel of
#     zerocopy-bf16+combo on `core` with and without Inductor's split reductions (`+nosplitred`), with their
#     timelines (DEADLINE 560 s)        -> $OUT/gpu_tests_round13.log, $OUT/profile_round13b_core.txt, $OUT/trace/
#   round13c = small13: spectral norm's power iteration timed alone, Inductor's batched form against the Triton
#     kernel's tile sizes, warps and stages (scripts/bench_small_ops.py --ops spectral) -> $OUT/small_ops_spectral.txt
#   round13d = tests13d,prof13d,bench13,small13: the spectral kernel's tests (GPU, Inductor too) and the fused bf16
#     plan with combined kernels = eager on `core`; every kernel of zerocopy-bf16+combo on `core` with its timeline;
#     `core` with every method, 3 windows, with the timer's overhead; last the spectral kernel timed
#     alone (round13c) (DEADLINE 580 s)
#          -> $OUT/gpu_tests_round13d.log, $OUT/profile_round13d_core.txt, $OUT/trace/, $OUT/core/, $OUT/small_ops_spectral.txt
#   round13e = full13: `full` with eager, both compiles and zerocopy-bf16+combo                  -> $OUT/full/
#   round13f = small13,prof13d: round13d without the bench (DEADLINE 300 s)
#   round13g = bench13g: `core` with compile, compile-bf16 and zerocopy-bf16+combo (DEADLINE 220 s) -> $OUT/core/
#   round15 (issue 32) = tests15,prof15: the C51 target kernel's tests (CPU form and GPU, Inductor too) and the
#     fused plans with it = eager on `core` (float32; bf16 with combined kernels); then zerocopy-bf16+combo
#     with run.c51_target_kernel=inductor (variant suffix +c51i) and with the kernel (since round 15 the default,
#     `auto`), each compiled afresh, twice in turn:
#     the step time, the kernels per step and how much they move between two compilations of one variant
#     (DEADLINE 580 s)                                  -> $OUT/gpu_tests_round15.log, $OUT/profile_round15_core.txt
#   round16 (issue 32) = prof16: every kernel of zerocopy-bf16+combo on `core`, then with the products tuned among
#     cuBLAS and Inductor's Triton GEMM templates (`+autotune`: about 10 s of tuning a product's shape, one shape
#     after another; 14 shapes took 150 s on an H100, so the stage has the whole call) (DEADLINE 580 s)
#                                                                               -> $OUT/profile_round16_core.txt
#   round16b = prof16t,prof16ws: the products as templates only (`+tritongemm`); then, in a process of its own,
#     zerocopy-bf16+combo without cuBLAS workspaces (CUBLAS_WORKSPACE_CONFIG=:0:0, CUBLASLT_WORKSPACE_SIZE=0: no
#     split-K products, whose partial sums need one) (DEADLINE 580 s)
#                                     -> $OUT/profile_round16_templates.txt, $OUT/profile_round16_noworkspace.txt
#   round17 (issue 32) = prof17: zerocopy-bf16+combo on `core` with cuBLAS's workspaces, then without them
#     (CUBLAS_WORKSPACE_CONFIG=:0:0, CUBLASLT_WORKSPACE_SIZE=0: no split-K product, no splitKreduce kernel), each
#     in a process of its own (the second builds from Inductor's FX graph cache) (DEADLINE 300 s)
#                                           -> $OUT/profile_round17_workspace.txt, $OUT/profile_round17_noworkspace.txt
#   round18 (issue 32) = prof18,tests18: zerocopy-bf16+combo on `core` without and with `+pdl` (Inductor's Triton
#     kernels under Hopper's programmatic dependent launch), in turn, twice; then the fused bf16 plan with combined
#     kernels against eager on `core` with TORCHINDUCTOR_ENABLE_PDL=1 (DEADLINE 420)
#                                                 -> $OUT/profile_round18_core.txt, $OUT/gpu_tests_round18.log
#   round19 (issue 32) = tests19,prof19: IQN's target quantiles as one Triton kernel (run.iqn_target_kernel=triton):
#     the kernel's tests (CPU form and GPU, Inductor too) and the fused plans with it = eager on `core` (float32;
#     bf16 with combined kernels); then zerocopy-bf16+combo without and with it (variant suffix +iqnk), each
#     compiled afresh, twice in turn (DEADLINE 560 s)  -> $OUT/gpu_tests_round19.log, $OUT/profile_round19_core.txt
#   round20 = tests20,small20,packmarket: the IQN kernel's tests (CPU form and GPU: round 19's call found its relu
#     dropping NaN on the GPU), the kernel timed alone at several rows and warps per program against Inductor's
#     written form (scripts/bench_small_ops.py --ops iqn), then the market recipe's pack of 16 beside its solo run
#     with Inductor's defaults (packcombo's control) (DEADLINE 330 s)
#          -> $OUT/gpu_tests_round20.log, $OUT/small_ops_iqn.txt, $OUT/packcombo.txt, $OUT/packcombo_market_default.json
#   round21 = tests21o,small21,prof21,tests21 (issue 32): the online IQN kernels' tests (CPU form and GPU, and the
#     fused plans with them against eager on `core`, float32 and bf16 with combined kernels); the online pass's
#     forward and backward timed alone, Inductor against the kernels at several backward tiles
#     (scripts/bench_small_ops.py --ops iqnonline); zerocopy-bf16+combo with IQN's target as Inductor's kernels
#     (`+iqni`), as the default (the Triton target kernel, since round 20), and with the online kernels too
#     (`+iqno`), each compiled afresh, twice in turn; then the bf16 equivalence tests of the defaults (DEADLINE 570 s)
#          -> $OUT/gpu_tests_round21o.log, $OUT/small_ops_iqnonline.txt, $OUT/profile_round21_core.txt, $OUT/gpu_tests_round21.log
#   round22 = tests22,small22,prof22,iqnodump (issue 32): the online IQN kernels' second form (two backward kernels,
#     each program summing its share of the weight gradients in registers, no atomics): the kernels' tests (CPU form
#     and GPU) and the fused plans with them against eager on `core` (float32; bf16 with combined kernels); forward
#     and backward alone against Inductor's at several blocks, programs and warps (bench_small_ops --ops iqnonline);
#     zerocopy-bf16+combo without and with them (+iqno), each compiled afresh, twice in turn; then +iqno alone in a
#     fresh Inductor cache, whose generated modules defining the step's costliest Inductor kernel are kept (round 21's
#     +iqno step had a 0.34 ms reduction the default step has not) (DEADLINE 570 s)
#          -> $OUT/gpu_tests_round22.log, $OUT/small_ops_iqnonline.txt, $OUT/profile_round22_core.txt,
#             $OUT/profile_round22_iqno.txt, $OUT/iqno_kernels.tar.gz
#   round25 = tests25,small25,prof25 (issue 32): the target pass kernel's bf16 combo equivalence test (round 24's stage
#     cut it), then the kernel alone at several rows, warps, stages and chunks a program against Inductor's form of the
#     same pass, and PER's priority write-back as it was (a float64 power for each of the pairwise max's M² pairs) and
#     as it is (the power of the max) (bench_small_ops.py --ops targetmlp,priority); last the default step's kernels,
#     tuned afresh (round 24: 0.779 ms, 147 kernels), with the generated code of its four costliest Inductor kernels
#     (round 24's two of 31-32 µs, `triton_red_fused_16` and `_20`, are not yet named) (DEADLINE 480 s)
#          -> $OUT/gpu_tests_round25.log, $OUT/small_ops_round25.txt, $OUT/profile_round25_core.txt,
#             $OUT/round25_kernels.tar.gz
#   round24 = tests24,prof24 (issue 32): the target pass's networks as one Triton kernel (run.target_mlp_kernel,
#     trainer/execution/kernels/mlp.py): its GPU tests (the compiled op at `core`'s sizes, 50 fused steps against eager
#     in float32 and bf16+combo), then zerocopy-bf16+combo without and with it (+mlpt), each afresh (DEADLINE 400 s)
#          -> $OUT/gpu_tests_round24.log, $OUT/profile_round24_core.txt, $OUT/profile_round24_VARIANT.txt
#   round23 = prof23 (issue 32): zerocopy-bf16+combo and +iqno (the online kernels, 128 rows a block since
#     round 22), each also with +subblocks (each part of a combined kernel with its own block sizes: round 22's +iqno
#     step had a combined kernel whose one XBLOCK cost 0.309 ms on a filled cache, 0.060 afresh), every variant tuned
#     in its own process with Inductor's caches off (--fresh-cache), about 110 s each (DEADLINE 560 s)
#          -> $OUT/profile_round23_core.txt (the step lines), $OUT/profile_round23_VARIANT.txt (`+` written `_`)
#   round23b = tests23,packattn: the bf16 combo case of the online kernels' equivalence test, which round 22's stage
#     cut; then the market pack's attention at K = 16 as the pack runs it (SDPA's math backend on 5-D inputs, the
#     gradient written out) against the runs folded into SDPA's batch (its fused kernels both ways)
#     (bench_small_ops.py --ops packattn) (DEADLINE 420 s)     -> $OUT/gpu_tests_round23.log, $OUT/small_ops_packattn.txt
#   pack13 = tests13k,packkeyed,packdefault,packkeyprof (issue 31): keyed random draws (run.rng=keyed,
#     trainer.algo.rng: a pack's runs draw in one launch a draw, not one a run): the kernel's GPU tests and a pack
#     step's kernels with torch's and keyed draws; the market recipe's pack of 16 beside solo seeds 1 and 2, keyed,
#     then with torch's draws (the control of the same call); then the keyed market pack's kernels at K = 16
#     (round 11 without: 338 kernels, 1.476 ms) (DEADLINE 580 s)
#          -> $OUT/gpu_tests_pack13.log, $OUT/packcombo.txt, $OUT/packcombo_market_{keyed,default}.json,
#             $OUT/pack13_profile_keyed.txt
#   pack15 = packiqno (issue 31): `core` packs of K = 16 and 64 (fused-bf16) beside zerocopy-bf16+combo solo, with
#     Inductor's IQN (the default) and then with the online IQN kernels (-o run.iqn_online_kernel=triton: the quantiles'
#     forward and gradient as two kernels that keep the [B·T, H] activations on chip). The packs' costliest kernels
#     are bandwidth-bound passes over IQN-sized activations (packs round 3: B·T = 32,768 rows a run), which the solo
#     step, bound by latency, does not feel (round 23: the kernels 0.06 ms slower solo); a pack may (DEADLINE 560 s)
#          -> $OUT/pack15_{default,iqno}.{json,md,log}
#   pack16 = tests16,packdrift (issue 31): where a keyed packed graph parts from its solo graphs (pack14: 2.7e-3 apart
#     after one replay, 2.2e-7 with torch's draws): first the keyed kernel's GPU tests, one of them the draws alone
#     captured and replayed against eager ones; then `profile_pack.py --divergence-only` steps the pack, its solo
#     graphs, its solo runs eagerly and the pack eagerly side by side, keyed, keyed as torch ops (--keyed-ops, not
#     the Triton kernel), then with torch's draws (the control), printing each pair's distance and each run's keyed
#     counters after every replay (DEADLINE 360 s)
#          -> $OUT/gpu_tests_pack16.log, $OUT/pack16_divergence_{keyed,keyedops,torch}.txt
#   pack14 = tests14,packkeyed,packdefault (issue 31): a packed graph against its solo graph plans with torch's draws
#     and keyed ones (pack13b's keyed market row failed at capture: torch's register_generator_state refuses a
#     KeyedGenerator, now left unregistered), then the market rows keyed and with torch's draws, each a pack of 16
#     beside solo seeds 1 and 2: is a keyed solo run faster (pack13b: 927 updates/s against 841 and 845)? (DEADLINE 580 s)
#          -> $OUT/gpu_tests_pack14.log, $OUT/packcombo.txt, $OUT/packcombo_market_{keyed,default}.{json,log}
#   pack14b = packhostkeyed,packhostdefault (issue 31): the market pack of 16 alone under cProfile, keyed then with torch's draws: the host
#     seconds of each direct callee of the training loop (collection, the update, evaluation, reports, bookkeeping),
#     where the keyed pack's 0.85 ms a pack step outside its timed sections goes (DEADLINE 420 s)
#          -> $OUT/pack_host_{keyed,default}.txt
#   pack13b = packkeyed,packattn,packdefault: pack13's keyed market row (it printed no table: the first row's three
#     processes compile into an empty cache, and 200 s was likely too short; now 300); the pack's attention forms
#     again, now with attention written out as products and as broadcast sums under torch.compile; then the default
#     market row, the call's control, if time is left (DEADLINE 540 s)
#          -> $OUT/packcombo.txt, $OUT/packcombo_market_{keyed,default}.{json,log}, $OUT/small_ops_packattn.txt
#   pack12 = packgrads,packsplit,packeval (issue 31): the market pack's long-row weight gradients as batched products
#     against split-K by hand (scripts/bench_small_ops.py --ops packgrads: are they round 11's slow FFMA/TF32
#     products, and does splitting their rows speed them); the market recipe's pack of 16 beside its solo run with
#     the pack's products split (run.pack_split_k, trainer.execution.split_k), and that pack's kernels at K = 16;
#     then the recipe's pack and solo run with no periodic evaluation (run.eval_every=0): how much of a pack step's
#     loop time the evaluations are (DEADLINE 540 s)
#          -> $OUT/small_ops_packgrads.txt, $OUT/packcombo.txt, $OUT/packcombo_market_{splitk,noeval}.json,
#             $OUT/pack12_profile_splitk.txt
#   pack11 = packmarket,packcfg,packprof (issue 31): the market recipe's pack of 16 beside its solo run, with Inductor's
#     defaults, then with run.combo_kernels (the pack compiles with PACK_COMBO_OPTIONS, the solo run with the fused
#     plans' benchmarked combinations); then the compiled market pack's kernels at K = 16 without and with them
#     (scripts/profile_pack.py) (DEADLINE 570 s)
#          -> $OUT/packcombo.txt, $OUT/packcombo_market_{default,config}.json, $OUT/pack11_profile_{default,combo}.txt
#   packcombo (issue 31): the compiled market pack under Inductor's combo kernels without their compile-time
#     benchmark (benchmark_combo_kernel=false): that benchmark launches each candidate kernel on made-up inputs
#     (`get_args`: random floats), from which the pack's sampling computes replay indices out of range, and the
#     indirect-index assert poisons the process (packs round 8). A pack of 2 market runs (300 updates) first; if it
#     trains, the market recipe as one pack of 16 seeds beside its solo run, and with PACKCOMBO_BF16=1 the recipe
#     in bf16 (run.precision) too; last, the market pack's compiled kernels at K = 1 and 16 (scripts/profile_pack.py)
#     (DEADLINE 570 s)                 -> $OUT/packcombo.txt, $OUT/packcombo_market_*.json, $OUT/packcombo_profile_market.txt
#                                         (and $OUT/packcombo_asserting_kernel.py, the generated kernel, if an assert fires)
#   collect (issue 15): the collection graph's GPU equivalence test (captured = uncaptured, bit for bit,
#     tests/trainer/execution/test_collect.py) and the GPU market training test, then the market's train rows
#     (examples/market-gpu.yaml, zerocopy K=10, 2000 updates) with run.collect_graph off and on
#                                                               -> $OUT/collect/{tests.log,graph-false,graph-true}
#   pack (issue 31): the packs' GPU tests (tests/trainer/execution/test_pack.py: a packed graph against its solo
#     graph plans over 2,000 updates, the compiled packed graph against the packed graph, kernels per pack step;
#     PACK_TESTS narrows them with pytest's -k), then `core` packs of K = PACK_SIZES (1,4,16,64) as PACK_METHODS
#     (fused-bf16,graph-bf16) beside those solo plans and zerocopy-bf16+combo (DEADLINE 560 s, its default here)
#                                                               -> $OUT/pack_tests.log, $OUT/pack/bench.{json,md,png}
#   packtrain (issue 31, real training): the batched collection's and the replay's GPU tests
#     (tests/trainer/execution/test_pack_collect.py, test_pack_market.py, tests/trainer/algo/replay; PACKTRAIN_TESTS=
#     skips them), then scripts/pack_recipes.py: the CartPole recipe as one pack of 16 seeds beside its solo run on
#     cuda, or each of PACKTRAIN_ROWS' ";"-separated option lists (DEADLINE 580 s, its default here)
#                                                   -> $OUT/packtrain_tests.log, $OUT/packtrain<i>/, packtrain<i>.log
#   Every stage gets at most what is left of DEADLINE seconds (default 550; 420 for round3) from the
#   script's start, so the call ends in time and keeps what the earlier stages wrote. Each process is killed 15 s
#   after its share (`timeout -k 15`): a training loop answers SIGTERM only at its next step, to checkpoint, which a
#   step that compiles first holds off (packs round 8's call likely lost its last two stages and its 600 s so).
# Needs the carried wheels in .whl/ (pydantic, gymnasium: not in the machine's image).
set -uo pipefail
began=$SECONDS
stage="${1:-all}"; shift || true
extra=("$@")  # bench options for the bench stages
[ "$stage" = all ] && stage=train,tests,curves,bench,profile
[ "$stage" = round2 ] && stage=bench-core,profile-bf16,bf16,bench-full
[ "$stage" = round3 ] && { stage=bench3,profile3,bf16-core,bench3-full; DEADLINE="${DEADLINE:-420}"; }
[ "$stage" = round3b ] && { stage=bench3b,profile3b,bf16-core; DEADLINE="${DEADLINE:-280}"; }
[ "$stage" = round4 ] && { stage=ab4,tests4,bench4,profile4; DEADLINE="${DEADLINE:-560}"; }
[ "$stage" = round5 ] && { stage=bench5,profile5; DEADLINE="${DEADLINE:-570}"; }
[ "$stage" = round5b ] && { stage=combo5,full5; DEADLINE="${DEADLINE:-580}"; }
[ "$stage" = round6 ] && { stage=ab6,profile6; DEADLINE="${DEADLINE:-560}"; }
[ "$stage" = round7 ] && { stage=small7,tests7,bench7,profile7; DEADLINE="${DEADLINE:-560}"; }
[ "$stage" = round7b ] && { stage=full7,train; DEADLINE="${DEADLINE:-560}"; }
[ "$stage" = round8 ] && { stage=full7,profile8; DEADLINE="${DEADLINE:-580}"; }
[ "$stage" = round9 ] && { stage=code9; DEADLINE="${DEADLINE:-300}"; }
[ "$stage" = round10 ] && { stage=tests10,bench10,profile10,tests10b; DEADLINE="${DEADLINE:-540}"; }
[ "$stage" = round11 ] && { stage=prof11,bench11; DEADLINE="${DEADLINE:-540}"; }
[ "$stage" = round11b ] && { stage=full11; DEADLINE="${DEADLINE:-540}"; }
[ "$stage" = round12 ] && { stage=tests12,prof12,bench12; DEADLINE="${DEADLINE:-570}"; }
[ "$stage" = round12b ] && { stage=bench12b,full12; DEADLINE="${DEADLINE:-570}"; }
[ "$stage" = round13 ] && { stage=prof13; DEADLINE="${DEADLINE:-300}"; }
[ "$stage" = round13b ] && { stage=tests13,prof13b; DEADLINE="${DEADLINE:-560}"; }
[ "$stage" = round13c ] && { stage=small13; DEADLINE="${DEADLINE:-200}"; }
[ "$stage" = round13d ] && { stage=tests13d,prof13d,bench13,small13; DEADLINE="${DEADLINE:-580}"; }
[ "$stage" = round13e ] && { stage=full13; DEADLINE="${DEADLINE:-560}"; }
[ "$stage" = round13f ] && { stage=small13,prof13d; DEADLINE="${DEADLINE:-300}"; }
[ "$stage" = round13g ] && { stage=bench13g; DEADLINE="${DEADLINE:-220}"; }
[ "$stage" = round15 ] && { stage=tests15,prof15; DEADLINE="${DEADLINE:-580}"; }
[ "$stage" = round16 ] && { stage=prof16; DEADLINE="${DEADLINE:-580}"; }
[ "$stage" = round16b ] && { stage=prof16t,prof16ws; DEADLINE="${DEADLINE:-580}"; }
[ "$stage" = round17 ] && { stage=prof17; DEADLINE="${DEADLINE:-300}"; }
[ "$stage" = round18 ] && { stage=prof18,tests18; DEADLINE="${DEADLINE:-420}"; }
[ "$stage" = round19 ] && { stage=tests19,prof19; DEADLINE="${DEADLINE:-560}"; }
[ "$stage" = round20 ] && { stage=tests20,small20,packmarket; DEADLINE="${DEADLINE:-330}"; }
[ "$stage" = round21 ] && { stage=tests21o,small21,prof21,tests21; DEADLINE="${DEADLINE:-570}"; }
[ "$stage" = round22 ] && { stage=tests22,small22,prof22,iqnodump; DEADLINE="${DEADLINE:-570}"; }
[ "$stage" = round23 ] && { stage=prof23; DEADLINE="${DEADLINE:-560}"; }
[ "$stage" = round23b ] && { stage=tests23,packattn; DEADLINE="${DEADLINE:-420}"; }
[ "$stage" = pack13 ] && { stage=tests13k,packkeyed,packdefault,packkeyprof; DEADLINE="${DEADLINE:-580}"; }
[ "$stage" = pack15 ] && { stage=packiqno; DEADLINE="${DEADLINE:-560}"; }
[ "$stage" = pack16 ] && { stage=tests16,packdrift; DEADLINE="${DEADLINE:-360}"; }
[ "$stage" = pack14 ] && { stage=tests14,packkeyed,packdefault; DEADLINE="${DEADLINE:-580}"; }
[ "$stage" = pack14b ] && { stage=packhostkeyed,packhostdefault; DEADLINE="${DEADLINE:-420}"; }
[ "$stage" = round24 ] && { stage=tests24,prof24; DEADLINE="${DEADLINE:-400}"; }
[ "$stage" = round25 ] && { stage=tests25,small25,prof25; DEADLINE="${DEADLINE:-480}"; }
[ "$stage" = pack13b ] && { stage=packkeyed,packattn,packdefault; DEADLINE="${DEADLINE:-540}"; }
[ "$stage" = pack12 ] && { stage=packgrads,packsplit,packeval; DEADLINE="${DEADLINE:-540}"; }
[ "$stage" = pack11 ] && { stage=packmarket,packcfg,packprof; DEADLINE="${DEADLINE:-570}"; }
[ "$stage" = packcombo ] && DEADLINE="${DEADLINE:-570}"
[ "$stage" = pack ] && DEADLINE="${DEADLINE:-560}"
[ "$stage" = packtrain ] && DEADLINE="${DEADLINE:-580}"
has() { [[ ",$stage," == *",$1,"* ]]; }
left() {  # seconds for a stage: its own limit, or what is left of DEADLINE if less (at least 1)
  local rest=$(( ${DEADLINE:-550} - (SECONDS - began) ))
  (( rest < 1 )) && rest=1
  echo $(( $1 < rest ? $1 : rest ))
}
OUT="${OUT:-/tmp/foxhunt-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}" || { echo "wheel install failed"; exit 3; }
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/device.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)' \
  | tee -a "$OUT/device.txt"
git rev-parse HEAD 2>/dev/null | tee -a "$OUT/device.txt"
if [ "$stage" = exec ]; then  # `gpu_check.sh exec CMD...`: any command with the wheels and the repo importable
  "${extra[@]}"; exit $?        # (two hand-written calls of 2026-12-07 failed at import without this setup)
fi
quick="--repeats 3 --no-timer-overhead"

if has train; then
  # every plan trains CartPole from an empty replay; graph = eager bit for bit over 2000 real updates
  timeout -k 15 "$(left "${TRAIN_TIMEOUT:-300}")" python3 -m pytest -m gpu -p no:cacheprovider -q -s -rA --timeout 280 \
    tests/trainer/runtime/test_train.py 2>&1 | grep -v vectorized_gather | tee "$OUT/gpu_train_tests.log" \
    | grep -E "passed|failed|PASS|FAIL|updates/s|drift|Error|assert" | tail -40
fi
if has tests; then
  # curves too: the slow 2000-step TF32 loss-curve test, in the same process (shares compiled kernels)
  marks="gpu and not slow"; has curves && marks="gpu"
  FOXHUNT_CURVES_OUT="$OUT/loss_curves.json" timeout -k 15 "${TEST_TIMEOUT:-330}" python3 -m pytest -m "$marks" \
    -p no:cacheprovider -q -s -rA --timeout 300 tests/trainer/execution/plans/test_equivalence.py 2>&1 \
    | grep -v vectorized_gather | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|PASS|FAIL|relative|gap|Error" | tail -40
  [ -f "$OUT/loss_curves.json" ] && python3 scripts/plot_loss_curves.py "$OUT/loss_curves.json" "$OUT/loss_curves.png"
fi
if has bench; then
  timeout -k 15 "${BENCH_TIMEOUT:-420}" python3 -m trainer bench --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -30
fi
if has profile; then
  # kernels per step and the costliest kernels of the fastest plan (scripts/profile_step.py)
  timeout -k 15 "${PROFILE_TIMEOUT:-200}" python3 scripts/profile_step.py --config core --variant zerocopy --variant zerocopy-bf16 --top 25 2>&1 \
    | grep -v "Warn\|check(" | tee "$OUT/profile_zerocopy_core.txt" | tail -30
fi

# ---- issue 31: packs of runs (stage pack) ----
if has pack; then
  budget=$(left 200)
  timeout -k 15 "$budget" python3 -m pytest -m gpu -p no:cacheprovider -q -s -rA --timeout "$budget" \
    -k "${PACK_TESTS:-pack}" tests/trainer/execution/test_pack.py 2>&1 | tee "$OUT/pack_tests.log" | grep -E "passed|failed|PASS|FAIL|kernels|packed|warning|  state|  replay|Error" | tail -40
  timeout -k 15 "$(left 360)" python3 -m trainer bench --configs core --methods zerocopy-bf16+combo \
    --pack "${PACK_SIZES:-1,4,16,64}" --pack-methods "${PACK_METHODS:-fused-bf16,graph-bf16}" --repeats 3 --no-timer-overhead --out "$OUT/pack" \
    "${extra[@]}" 2>&1 | tee "$OUT/bench_pack.log" | grep -v "Warn\|check(" | tail -24
fi

# ---- issue 31: packs in real training (stage packtrain) ----
if has packtrain; then
  budget=$(left 90)
  [ -n "${PACKTRAIN_TESTS-1}" ] && timeout -k 15 "$budget" python3 -m pytest -m gpu -p no:cacheprovider -q -rA --timeout "$budget" \
    tests/trainer/execution/test_pack_collect.py tests/trainer/execution/test_pack_market.py tests/trainer/algo/replay \
    tests/trainer/execution/data/test_transfer.py 2>&1 | tee "$OUT/packtrain_tests.log" | tail -8
  # PACKTRAIN_ROWS: one pack_recipes.py run per ";"-separated argument list, each into $OUT/packtrain<i>/
  IFS=';' read -ra rows <<< "${PACKTRAIN_ROWS:-${PACKTRAIN_ARGS:-}}"; [ ${#rows[@]} -eq 0 ] && rows=("")
  for i in "${!rows[@]}"; do
    timeout -k 15 "$(left 480)" python3 scripts/pack_recipes.py --out "$OUT/packtrain$i" --max-seconds 180 ${rows[$i]} 2>&1 \
      | tee "$OUT/packtrain$i.log" | tail -12
    rm -rf "/tmp/packtrain-runs$i" && mv "$OUT/packtrain$i/runs" "/tmp/packtrain-runs$i"  # too large to come back
  done
fi

market_profile() {  # FILE LABEL OVERRIDE: the compiled market pack's kernels at K = 16 -> $OUT/FILE, its count line
  timeout -k 15 "$(left 90)" python3 scripts/profile_pack.py --config examples/market.yaml --compiled --sizes 16 \
    --no-divergence --top 30 -o "$3" 2>&1 | grep -v "Warn\|check(" > "$OUT/$1"
  grep "kernels," "$OUT/$1" | sed "s/^/$2: /" | tee -a "$OUT/packcombo.txt"
}
market_host() {  # NAME OPTIONS... : the market pack of 16 alone under cProfile -> $OUT/pack_host_NAME.txt: the host
  # time of the training loop's direct callees (`pack_train._train`): which part of a pack step's loop is not its
  # timed sections (packs round 13: 0.85 ms a pack step keyed, 0.41 with torch's draws); then the 30 functions of most own host time;
  # the profile itself too (-> pack_host_NAME.prof.gz, to read here); round 24's listing of the callees came back empty
  # (Python 3.12 there), so the loop's own functions are listed by file as well
  local name=$1; shift
  timeout -k 15 "$(left 200)" python3 -m cProfile -o "/tmp/pack-host-$name.prof" scripts/pack_recipes.py \
    --config examples/market.yaml --margin 1.0 --cpu-steps 0 --plan fused --solo-seeds= --out "/tmp/pack-host-$name" \
    "$@" > "/tmp/pack-host-$name.log" 2>&1
  { echo "== $name ($*): $(grep -m1 'updates/s over' "/tmp/pack-host-$name.log")"
    grep -A2 '^| row' "/tmp/pack-host-$name.log"  # the row's table: its loop's seconds, of it evaluating
    python3 -c 'import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats("cumulative").print_callees(r"\(_train\)"); pstats.Stats(sys.argv[1]).sort_stats("cumulative").print_stats(r"trainer/(runtime|execution)/(pack|timing|collect)", 40); pstats.Stats(sys.argv[1]).sort_stats("tottime").print_stats(30)' \
      "/tmp/pack-host-$name.prof"; } > "$OUT/pack_host_$name.txt" 2>&1
  gzip -c "/tmp/pack-host-$name.prof" > "$OUT/pack_host_$name.prof.gz"  # round 24's listing lacked the callees
  head -1 "$OUT/pack_host_$name.txt"
}
market_row() {  # NAME SECONDS OPTIONS... : the market recipe, a pack of 16 beside solo seeds 1 and 2 -> $OUT/packcombo_market_NAME.json
  local name=$1 seconds=$2 report="$OUT/packcombo.txt"; shift 2
  timeout -k 15 "$(left "$seconds")" python3 scripts/pack_recipes.py --config examples/market.yaml --margin 1.0 \
    --cpu-steps 0 --plan fused --solo-seeds 1,2 --out "/tmp/packcombo-market-$name" "$@" \
    > "/tmp/packcombo-market-$name.log" 2>&1
  { echo "== market $name ($*)"; grep -A5 '^| row' "/tmp/packcombo-market-$name.log" \
      || { echo "no table: the log's last lines"; tail -25 "/tmp/packcombo-market-$name.log"; }; } | tee -a "$report"
  cp "/tmp/packcombo-market-$name/pack_recipes.json" "$OUT/packcombo_market_$name.json" 2>/dev/null
  grep -v "Extern Choice" "/tmp/packcombo-market-$name.log" > "$OUT/packcombo_market_$name.log"
}

# ---- issue 31: the compiled pack under Inductor's combo kernels (stage packcombo) ----
if has packcombo; then
  report="$OUT/packcombo.txt"
  unbenchmarked=(--inductor combo_kernels=true --inductor benchmark_combo_kernel=false)
  CUDA_LAUNCH_BLOCKING=1 timeout -k 15 "$(left 150)" python3 scripts/pack_recipes.py --config examples/market.yaml \
    --margin -100 --steps 300 --pack 2 --solo-seeds= --cpu-steps 0 --plan fused --max-seconds 0 \
    -o data.learning_starts=640 "${unbenchmarked[@]}" --out /tmp/packcombo-probe > /tmp/packcombo-probe.log 2>&1; rc=$?
  echo "== a pack of 2 under unbenchmarked combo kernels: exit $rc," \
    "$(grep -c 'index out of bounds' /tmp/packcombo-probe.log) failed index asserts;" \
    "$(grep -m1 'updates/s over' /tmp/packcombo-probe.log)" | tee -a "$report"
  grep -v 'index out of bounds' /tmp/packcombo-probe.log | grep -m1 -B2 -A8 'Error' >> "$report"
  # an assert names the generated module it fired in: keep that kernel's source (round 8's probes could not)
  asserted=$(grep -m1 -o '/tmp/torchinductor_[^:]*\.py' /tmp/packcombo-probe.log)
  [ -n "$asserted" ] && cp "$asserted" "$OUT/packcombo_asserting_kernel.py"
  [ $rc = 0 ] && market_row combo 150 "${unbenchmarked[@]}"
  [ $rc = 0 ] && [ -n "${PACKCOMBO_BF16:-}" ] && market_row bf16 150 "${unbenchmarked[@]}" -o run.precision=bf16
  # where the market's packed update (1.76 ms a pack step at K = 16, 0.47 ms solo) goes: its compiled kernels, K = 1 and 16
  timeout -k 15 "$(left 150)" python3 scripts/profile_pack.py --config examples/market.yaml --compiled --sizes 1,16 \
    --no-divergence --top 30 2>&1 | grep -v "Warn\|check(" > "$OUT/packcombo_profile_market.txt"
  tail -34 "$OUT/packcombo_profile_market.txt" | tee -a "$report"
fi

# ---- issue 15: the market's collection graph (stage collect) ----
if has collect; then
  mkdir -p "$OUT/collect"
  budget=$(left 150)
  timeout -k 15 "$budget" python3 -m pytest -m gpu -p no:cacheprovider -q -rA --timeout "$budget" tests/trainer/execution/test_collect.py \
    "tests/trainer/runtime/test_train.py::test_the_market_trains_on_the_gpu_env_with_zerocopy_and_collects_without_a_sync" 2>&1 \
    | grep -v vectorized_gather | tee "$OUT/collect/tests.log" | grep -E "passed|failed|PASS|FAIL|Error" | tail -8
  for flag in false true; do
    timeout -k 15 "$(left 120)" python3 -m trainer bench --configs "" --train market --train-plans zerocopy --train-updates 2000 \
      --train-override "run.collect_graph=$flag" --out "$OUT/collect/graph-$flag" 2>&1 | grep -v "Warn\|check(" | tail -3
  done
fi

# ---- issue 14, rounds 2-5: each stage one call of these, within its budget (`left`) ----
bench_preset() {  # PRESET METHODS SECONDS [bench options...] -> $OUT/PRESET/bench.{json,md,png}, $OUT/bench_PRESET.log
  local preset=$1 methods=$2 seconds=$3; shift 3
  timeout -k 15 "$(left "$seconds")" python3 -m trainer bench --configs "$preset" --methods "$methods" --out "$OUT/$preset" \
    "$@" "${extra[@]}" 2>&1 | tee "$OUT/bench_$preset.log" | grep -v "Warn\|check(" | tail -16
}
profile_core() {  # FILE SECONDS VARIANT... : kernels per step on PRESET (core), the costliest first -> $OUT/FILE
  local file=$1 seconds=$2 variants=(); shift 2
  for v in "$@"; do variants+=(--variant "$v"); done
  [ -n "${TRACE:-}" ] && variants+=(--trace "$TRACE")
  [ -n "${FRESH:-}" ] && variants+=(--fresh-cache)
  timeout -k 15 "$(left "$seconds")" python3 scripts/profile_step.py --config "${PRESET:-core}" "${variants[@]}" --top "${TOP:-30}" 2>&1 \
    | grep -v "Warn\|check(" | tee "$OUT/$file" | tail -40
  [ -n "${TRACE:-}" ] && gzip -f "$TRACE"/*.json  # a few MB each as text
}
kernel_modules() {  # CACHE PROFILE TAR N: the generated modules (under Inductor's cache CACHE) defining the N costliest
  # Inductor kernels that $OUT/PROFILE names -> $OUT/TAR (a kernel's name is per graph: every module defining it)
  local cache=$1 profile=$2 tar=$3 n=$4 kernels
  kernels=$(grep -o "triton_[a-z]*_fused_[A-Za-z0-9_]*" "$OUT/$profile" | awk '!seen[$0]++' | head -n "$n")
  [ -z "$kernels" ] && return 0
  for kernel in $kernels; do grep -rl --include=*.py "def $kernel(" "$cache"; done | sort -u \
    | tar -czf "$OUT/$tar" -T - 2>/dev/null && echo "kept the modules defining" $kernels
}
gpu_tests() {  # LOG SECONDS TEST... -> $OUT/LOG
  local log=$1 budget; budget=$(left "$2"); shift 2
  timeout -k 15 "$budget" python3 -m pytest -m "${MARK:-gpu}" -p no:cacheprovider -q -s -rA --timeout "$budget" "$@" 2>&1 \
    | grep -v vectorized_gather | tee "$OUT/$log" | grep -E "passed|failed|PASS|FAIL|relative|gap|Error" | tail -20
}

bf16_test="tests/trainer/execution/plans/test_equivalence.py::test_fused_bf16_matches_eager_after_50_steps"

# ---- round 20 (issues 31 and 32) ----
has tests20 && MARK="gpu or not gpu" gpu_tests gpu_tests_round20.log 90 tests/trainer/execution/kernels/test_iqn.py
has small20 && timeout -k 15 "$(left 80)" python3 scripts/bench_small_ops.py --ops iqn 2>&1 | grep -v "Extern Choice" \
  | tee "$OUT/small_ops_iqn.txt" | tail -8
has tests21o && MARK="gpu or not gpu" gpu_tests gpu_tests_round21o.log 150 tests/trainer/execution/kernels/test_iqn.py \
  tests/trainer/execution/plans/test_equivalence.py::test_the_iqn_online_kernels_match_eager_after_50_steps
has small21 && timeout -k 15 "$(left 90)" python3 scripts/bench_small_ops.py --ops iqnonline 2>&1 | grep -v "Extern Choice" \
  | tee "$OUT/small_ops_iqnonline.txt" | tail -8
has prof21 && TOP=30 profile_core profile_round21_core.txt 280 zerocopy-bf16+combo+iqni zerocopy-bf16+combo \
  zerocopy-bf16+combo+iqno zerocopy-bf16+combo+iqni zerocopy-bf16+combo zerocopy-bf16+combo+iqno
has tests21 && gpu_tests gpu_tests_round21.log 150 "$bf16_test[fused-core]" "$bf16_test[fused-combo-core]"
has tests22 && MARK="gpu or not gpu" gpu_tests gpu_tests_round22.log 240 tests/trainer/execution/kernels/test_iqn.py \
  tests/trainer/execution/plans/test_equivalence.py::test_the_iqn_online_kernels_match_eager_after_50_steps
if has prof23; then  # one process a variant: nothing tuned by one is served to the next
  for v in zerocopy-bf16+combo zerocopy-bf16+combo+subblocks zerocopy-bf16+combo+iqno zerocopy-bf16+combo+iqno+subblocks; do
    FRESH=1 TOP=12 profile_core "profile_round23_${v//+/_}.txt" 130 "$v" > /dev/null  # `+` does not come back
    grep -h "ms/step" "$OUT/profile_round23_${v//+/_}.txt" | tee -a "$OUT/profile_round23_core.txt"
  done
fi
has tests24 && gpu_tests gpu_tests_round24.log 150 tests/trainer/execution/kernels/test_mlp.py \
  tests/trainer/execution/plans/test_equivalence.py::test_the_target_mlp_kernel_matches_eager_after_50_steps
has tests25 && gpu_tests gpu_tests_round25.log 220 \
  "tests/trainer/execution/plans/test_equivalence.py::test_the_target_mlp_kernel_matches_eager_after_50_steps[fused-bf16-combo]"
has small25 && timeout -k 15 "$(left 150)" python3 scripts/bench_small_ops.py --ops targetmlp,priority 2>&1 \
  | grep -v "Extern Choice" | tee "$OUT/small_ops_round25.txt" | tail -14
if has prof25; then  # tuned afresh in an empty cache, whose generated modules name the costliest kernels' code
  rm -rf /tmp/r25-cache
  TORCHINDUCTOR_CACHE_DIR=/tmp/r25-cache FRESH=1 profile_core profile_round25_core.txt 130 zerocopy-bf16+combo
  kernel_modules /tmp/r25-cache profile_round25_core.txt round25_kernels.tar.gz 4
fi
if has prof24; then  # one process a variant, Inductor's caches off (round 23)
  for v in zerocopy-bf16+combo zerocopy-bf16+combo+mlpt; do
    FRESH=1 TOP=12 profile_core "profile_round24_${v//+/_}.txt" 125 "$v" > /dev/null  # `+` does not come back
    grep -h "ms/step" "$OUT/profile_round24_${v//+/_}.txt" | tee -a "$OUT/profile_round24_core.txt"
  done
fi
has tests23 && MARK="gpu or not gpu" gpu_tests gpu_tests_round23.log 300 \
  "tests/trainer/execution/plans/test_equivalence.py::test_the_iqn_online_kernels_match_eager_after_50_steps[fused-bf16-combo]"
has small22 && timeout -k 15 "$(left 90)" python3 scripts/bench_small_ops.py --ops iqnonline 2>&1 | grep -v "Extern Choice" \
  | tee "$OUT/small_ops_iqnonline.txt" | tail -8
has prof22 && TOP=30 profile_core profile_round22_core.txt 150 zerocopy-bf16+combo zerocopy-bf16+combo+iqno \
  zerocopy-bf16+combo zerocopy-bf16+combo+iqno
has packgrads && timeout -k 15 "$(left 60)" python3 scripts/bench_small_ops.py --ops packgrads 2>&1 \
  | tee "$OUT/small_ops_packgrads.txt" | tail -22
if has packsplit; then
  market_row splitk 200 -o run.pack_split_k=true
  market_profile pack12_profile_splitk.txt "split-K" run.pack_split_k=true
fi
has tests13k && MARK="gpu or not gpu" gpu_tests gpu_tests_pack13.log 120 tests/trainer/execution/kernels/test_keyed.py \
  tests/trainer/execution/test_pack.py::test_a_pack_step_launches_one_runs_kernels_and_its_draws
has tests14 && gpu_tests gpu_tests_pack14.log 200 \
  tests/trainer/execution/test_pack.py::test_a_packed_graph_starts_as_its_solo_runs_and_its_drift_over_2000_updates
has packkeyed && market_row keyed 300 -o run.rng=keyed  # the first row compiles into an empty cache
has packattn && timeout -k 15 "$(left 150)" python3 scripts/bench_small_ops.py --ops packattn 2>&1 \
  | grep -v "Extern Choice" | tee "$OUT/small_ops_packattn.txt" | tail -7
has packdefault && market_row default 200
has tests16 && gpu_tests gpu_tests_pack16.log 60 tests/trainer/execution/kernels/test_keyed.py
if has packdrift; then  # which captured form leaves the eager numbers under keyed draws (torch's: the control)
  for form in keyed keyedops torch; do
    opts=(-o "run.rng=${form%ops}"); [ "$form" = keyedops ] && opts+=(--keyed-ops)
    timeout -k 15 "$(left 110)" python3 scripts/profile_pack.py --divergence-only --updates 30 "${opts[@]}" 2>&1 \
      | grep -v "Warn\|warn\|Extern Choice" > "$OUT/pack16_divergence_$form.txt"
    tail -5 "$OUT/pack16_divergence_$form.txt"
  done
fi
if has packiqno; then  # the same bench twice, the second with the online IQN kernels in packs and solo alike
  for name in default iqno; do
    opts=(); [ "$name" = iqno ] && opts=(-o run.iqn_online_kernel=triton)
    timeout -k 15 "$(left 270)" python3 -m trainer bench --configs core --methods zerocopy-bf16+combo --pack 16,64 \
      --pack-methods fused-bf16 --repeats 3 --no-timer-overhead --out "/tmp/pack15-$name" "${opts[@]}" 2>&1 \
      | grep -v "Warn\|check(" > "$OUT/pack15_$name.log"
    cp "/tmp/pack15-$name/bench.json" "$OUT/pack15_$name.json" 2>/dev/null
    cp "/tmp/pack15-$name/bench.md" "$OUT/pack15_$name.md" 2>/dev/null && tail -8 "$OUT/pack15_$name.md"
  done
fi
has packhostkeyed && market_host keyed -o run.rng=keyed
has packhostdefault && market_host default
has packkeyprof && market_profile pack13_profile_keyed.txt "keyed" run.rng=keyed
has packeval && market_row noeval 200 -o run.eval_every=0
if has iqnodump; then
  rm -rf /tmp/iqno-cache
  TORCHINDUCTOR_CACHE_DIR=/tmp/iqno-cache TOP=12 profile_core profile_round22_iqno.txt 240 zerocopy-bf16+combo+iqno
  kernel_modules /tmp/iqno-cache profile_round22_iqno.txt iqno_kernels.tar.gz 1
fi
has packmarket && market_row default 200
has packcfg && market_row config 230 -o run.combo_kernels=true
if has packprof; then
  for combo in false true; do
    market_profile "pack11_profile_$combo.txt" "combo kernels $combo" "run.combo_kernels=$combo"
  done
fi

# ---- issue 32: round 15 ----
has tests15 && MARK="gpu or not gpu" gpu_tests gpu_tests_round15.log 200 tests/trainer/execution/kernels/test_c51.py \
  tests/trainer/execution/plans/test_equivalence.py::test_the_c51_target_kernel_matches_eager_after_50_steps
has prof15 && TOP=40 profile_core profile_round15_core.txt 370 \
  zerocopy-bf16+combo+c51i zerocopy-bf16+combo zerocopy-bf16+combo+c51i zerocopy-bf16+combo

# ---- issue 32: round 16 ----
has prof16 && TOP=40 profile_core profile_round16_core.txt 570 zerocopy-bf16+combo zerocopy-bf16+combo+autotune
has prof16t && TOP=40 profile_core profile_round16_templates.txt 420 zerocopy-bf16+combo+tritongemm
has prof16ws && CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0 TOP=40 \
  profile_core profile_round16_noworkspace.txt 150 zerocopy-bf16+combo

# ---- issue 32: round 17 ----
has prof17 && TOP=40 profile_core profile_round17_workspace.txt 180 zerocopy-bf16+combo
has prof17 && CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0 TOP=40 \
  profile_core profile_round17_noworkspace.txt 120 zerocopy-bf16+combo


# ---- issue 32: round 18 ----
has prof18 && TOP=40 profile_core profile_round18_core.txt 300 \
  zerocopy-bf16+combo zerocopy-bf16+combo+pdl zerocopy-bf16+combo zerocopy-bf16+combo+pdl
has tests18 && TORCHINDUCTOR_ENABLE_PDL=1 gpu_tests gpu_tests_round18.log 120 "$bf16_test[fused-combo-core]"

# ---- issue 32: round 19 ----
has tests19 && MARK="gpu or not gpu" gpu_tests gpu_tests_round19.log 220 tests/trainer/execution/kernels/test_iqn.py \
  tests/trainer/execution/plans/test_equivalence.py::test_the_iqn_target_kernel_matches_eager_after_50_steps
has prof19 && TOP=40 profile_core profile_round19_core.txt 330 \
  zerocopy-bf16+combo zerocopy-bf16+combo+iqnk zerocopy-bf16+combo zerocopy-bf16+combo+iqnk

# round 2
has bench-core && bench_preset core eager,compile,compile-bf16,graph,dual,fused,zerocopy,zerocopy-bf16 210 $quick
has profile-bf16 && profile_core profile_zerocopy_bf16_core.txt 80 zerocopy-bf16
if has bf16; then
  tests=("$bf16_test[fused-core]" tests/trainer/execution/plans/test_equivalence.py::test_bf16_loss_curves_agree_over_2000_steps)
  [ -n "${BF16_FULL:-}" ] && tests+=("$bf16_test[fused-full]")
  FOXHUNT_CURVES_OUT="$OUT/loss_curves.json" gpu_tests gpu_tests_bf16.log 120 "${tests[@]}"
  [ -f "$OUT/loss_curves-bf16.json" ] \
    && python3 scripts/plot_loss_curves.py "$OUT/loss_curves-bf16.json" "$OUT/loss_curves-bf16.png" bf16
fi
has bench-full && bench_preset full eager,graph,dual,zerocopy-bf16,fused,zerocopy 260 $quick

# round 3
has bench3 && bench_preset core eager,compile,compile-bf16,fused,zerocopy,zerocopy-bf16,zerocopy-bf16+combo 240 $quick
has profile3 && profile_core profile_round3_core.txt 100 zerocopy-bf16 zerocopy-bf16+combo
has bench3b && bench_preset core compile-bf16,zerocopy-bf16,zerocopy-bf16+combo 170 $quick
has profile3b && profile_core profile_round3_core.txt 80 zerocopy-bf16+combo
has bf16-core && gpu_tests gpu_tests_bf16_core.log 80 "$bf16_test[fused-core]"
if has bench3-full; then
  if (( $(left 150) >= 60 )); then  # two full compilations do not fit in less
    bench_preset full compile-bf16,zerocopy-bf16 150 $quick
  else
    echo "bench3-full: skipped, $(left 150) s left"
  fi
fi

# round 4
if has ab4; then
  # perf_hints: Inductor says why it skips its CUDA graphs (mutated inputs, CPU tensors, ...), if it does
  TORCH_LOGS=perf_hints timeout -k 15 "$(left 170)" python3 -m trainer bench --ab .ab/A,.ab/B --rounds "${AB_ROUNDS:-1}" \
    --configs core --methods compile-bf16 $quick --out "$OUT/ab" 2>&1 | tee "$OUT/ab.log" | grep -v "Warn\|check(" \
    | grep -i -E "skipping cudagraph|ms/step|ratio|^\|" | tail -16
fi
has tests4 && gpu_tests gpu_tests_round4.log 130 tests/trainer/execution/plans/test_replay_ops.py "$bf16_test[fused-core]"
has bench4 && bench_preset core compile-bf16,zerocopy-bf16,zerocopy-bf16+combo 180 $quick
has profile4 && profile_core profile_round4_core.txt 90 zerocopy-bf16+combo

# round 5 (round5 and round5b: two calls)
has bench5 && bench_preset core eager,compile,compile-bf16,fused,zerocopy,zerocopy-bf16,zerocopy-bf16+combo 330 --repeats 3
has profile5 && TOP=400 profile_core profile_round5_core.txt 250 zerocopy-bf16+combo zerocopy-bf16+combo+nosplitk
has combo5 && gpu_tests gpu_tests_round5.log 150 tests/trainer/execution/plans/test_replay_ops.py tests/trainer/execution/plans/test_capture.py \
  "$bf16_test[fused-core]" "$bf16_test[fused-combo-core]"
has full5 && bench_preset full compile-bf16,zerocopy-bf16+combo 420 $quick
# round 6
if has ab6; then
  timeout -k 15 "$(left 150)" python3 -m trainer bench --ab .ab/A,.ab/B --rounds "${AB_ROUNDS:-1}" --configs core \
    --methods zerocopy-bf16 $quick --out "$OUT/ab" 2>&1 | tee "$OUT/ab.log" | grep -v "Warn\|check(" \
    | grep -i -E "ms/step|ratio|^\|" | tail -12
fi
if has profile6; then
  TOP=400 TRACE="$OUT/trace" profile_core profile_round6_core.txt 180 zerocopy-bf16+combo
  TOP=400 TRACE="$OUT/trace" PRESET=full profile_core profile_round6_full.txt 260 zerocopy-bf16+combo
fi
# round 7 (round7 and round7b: two calls)
has small7 && timeout -k 15 "$(left 90)" python3 scripts/bench_small_ops.py 2>&1 | grep -v "Extern Choice" \
  | tee "$OUT/small_ops.txt" | tail -8
has tests7 && MARK="gpu or not gpu" gpu_tests gpu_tests_round7.log 150 tests/trainer/execution/kernels "$bf16_test[fused-core]"
has bench7 && bench_preset core compile-bf16,zerocopy-bf16,zerocopy-bf16+combo 300 $quick
has profile7 && TOP=400 TRACE="$OUT/trace" profile_core profile_round7_core.txt 120 zerocopy-bf16+combo
has full7 && bench_preset full compile-bf16,zerocopy-bf16+combo 420 $quick
has profile8 && TOP=400 TRACE="$OUT/trace" PRESET=full profile_core profile_round8_full.txt 200 zerocopy-bf16
# round 9
if has code9; then
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-code9
  TOP=400 TRACE="$OUT/trace" profile_core profile_round9_core.txt 250 zerocopy-bf16
  (cd "$TORCHINDUCTOR_CACHE_DIR" && find . -name "*.py" -size +1k | tar -czf "$OUT/inductor_code.tgz" -T -)
  unset TORCHINDUCTOR_CACHE_DIR
fi
# round 10
has tests10 && gpu_tests gpu_tests_round10.log 170 tests/trainer/algo/replay/test_buffer_gpu.py \
  tests/trainer/execution/plans/test_replay_ops.py tests/trainer/execution/plans/test_capture.py \
  "tests/trainer/execution/plans/test_equivalence.py::test_fed_plan_matches_eager_after_50_steps[dual-core]" \
  "tests/trainer/execution/plans/test_equivalence.py::test_zerocopy_matches_eager_sampling_in_graph[core]" \
  "tests/trainer/execution/plans/test_equivalence.py::test_guard_skips_poisoned_step_inside_graph[dual]" \
  "tests/trainer/runtime/test_train.py::test_cartpole_trains_3000_updates_with_each_plan_from_an_empty_replay[zerocopy-k10]"
has bench10 && bench_preset core compile-bf16,zerocopy-bf16,zerocopy-bf16+combo 250 $quick
has profile10 && TOP=400 TRACE="$OUT/trace" profile_core profile_round10_core.txt 120 zerocopy-bf16+combo
has tests10b && gpu_tests gpu_tests_round10b.log 120 "$bf16_test[fused-combo-core]"
# round 11
if has prof11; then
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-code11
  TOP=400 TRACE="$OUT/trace" profile_core profile_round11_core.txt 250 zerocopy-bf16+combo zerocopy-bf16+combo+combo16
  (cd "$TORCHINDUCTOR_CACHE_DIR" && find . -name "*.py" -size +1k | tar -czf "$OUT/inductor_code.tgz" -T -)
  unset TORCHINDUCTOR_CACHE_DIR
fi
has bench11 && bench_preset core compile,compile-bf16,fused,zerocopy,zerocopy-bf16,zerocopy-bf16+combo 280 $quick
has full11 && bench_preset full compile-bf16,zerocopy-bf16,zerocopy-bf16+combo 500 $quick
# round 12
has tests12 && gpu_tests gpu_tests_round12.log 60 tests/trainer/execution/plans/test_replay_ops.py::test_combined_replay_ops_match_eager_on_gpu
has prof12 && TOP=80 TRACE="$OUT/trace" profile_core profile_round12_core.txt 250 \
  zerocopy-bf16+combo zerocopy-bf16+combo+allcombo
has bench12 && bench_preset core compile-bf16,zerocopy-bf16,zerocopy-bf16+combo 260 $quick
has bench12b && bench_preset core compile,compile-bf16,fused,zerocopy,zerocopy-bf16,zerocopy-bf16+combo 260 $quick
has full12 && bench_preset full compile-bf16,zerocopy-bf16+combo 400 $quick
# round 13
if has prof13; then
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-code13
  TOP=400 TRACE="$OUT/trace" profile_core profile_round13_core.txt 250 zerocopy-bf16+combo
  (cd "$TORCHINDUCTOR_CACHE_DIR" && find . -name "*.py" -size +1k | tar -czf "$OUT/inductor_code.tgz" -T -)
  unset TORCHINDUCTOR_CACHE_DIR
fi
has tests13 && MARK="gpu or not gpu" gpu_tests gpu_tests_round13.log 220 tests/trainer/execution/kernels/test_spectral.py \
  "$bf16_test[fused-combo-core]" \
  "tests/trainer/execution/plans/test_equivalence.py::test_fed_plan_matches_eager_after_50_steps[dual-core]" \
  "tests/trainer/execution/plans/test_equivalence.py::test_zerocopy_matches_eager_sampling_in_graph[core]" \
  "tests/trainer/execution/plans/test_equivalence.py::test_guard_skips_poisoned_step_inside_graph[dual]"
has prof13b && TOP=60 TRACE="$OUT/trace" profile_core profile_round13b_core.txt 330 \
  zerocopy-bf16+combo zerocopy-bf16+combo+nosplitred
has tests13d && MARK="gpu or not gpu" gpu_tests gpu_tests_round13d.log 150 tests/trainer/execution/kernels/test_spectral.py \
  "$bf16_test[fused-combo-core]"
has prof13d && TOP=400 TRACE="$OUT/trace" profile_core profile_round13d_core.txt 120 zerocopy-bf16+combo
has bench13 && bench_preset core eager,compile,compile-bf16,fused,zerocopy,zerocopy-bf16,zerocopy-bf16+combo 330 --repeats 3
has bench13g && bench_preset core compile,compile-bf16,zerocopy-bf16+combo 215 $quick
has small13 && timeout -k 15 "$(left 180)" python3 scripts/bench_small_ops.py --ops spectral 2>&1 | grep -v "Extern Choice" \
  | tee "$OUT/small_ops_spectral.txt" | tail -9
has full13 && bench_preset full eager,compile,compile-bf16,zerocopy-bf16+combo 540 $quick
echo "gpu_check: $(( SECONDS - began )) s"
# A device call returns at most 8 files from $OUT: past that, everything goes back as one archive.
if (( $(find "$OUT" -type f | wc -l) > 8 )); then
  tar -czf /tmp/gpu_check.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/gpu_check.tgz "$OUT/"
  echo "gpu_check: \$OUT packed into gpu_check.tgz"
fi
