import time, torch
from trainer.config import build_config
from trainer.data.market import market_goal_spec
from trainer.data.spec import EnvSpec, Transitions
from trainer.replay import ReplayBuffer
cfg = build_config({"replay": {"capacity": 1_000_000, "storage_dtype": "bfloat16"}, "data": {"num_envs": 64}, "run": {"batch_size": 1024, "steps": 2000}})
spec = EnvSpec(64, 3, 5, market_goal_spec())
g = torch.Generator("cuda").manual_seed(0)
rb = ReplayBuffer(cfg, spec, "cuda", g)
N = 200_000
rows = Transitions(obs=torch.randn(N, 64), action=torch.randint(0, 5, (N, 3)), reward=torch.randn(N), next_obs=torch.randn(N, 64),
    done=torch.zeros(N), last=(torch.arange(N) % 200 == 199), achieved_goal=torch.randn(N, 3), base_reward=torch.randn(N))
t=time.time()
for _ in range(5): rb.extend(rows)
torch.cuda.synchronize(); print("extend 1M rows s", round(time.time()-t, 3), len(rb))
b = rb.empty_batch(1024)
step = torch.zeros((), dtype=torch.int64, device="cuda")
def graph_ms(fn, label):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph(); gr.register_generator_state(g)
    with torch.cuda.graph(gr): fn()
    for _ in range(10): gr.replay()
    torch.cuda.synchronize(); t=time.time()
    for _ in range(300): gr.replay()
    torch.cuda.synchronize(); print(label, "graph ms", round((time.time()-t)/300*1e3, 4))
def eager_ms(fn, label):
    for _ in range(5): fn()
    torch.cuda.synchronize(); t=time.time()
    for _ in range(100): fn()
    torch.cuda.synchronize(); print(label, "eager ms", round((time.time()-t)/100*1e3, 4))
full = lambda: (rb.sample_into(b, step), rb.update_priorities(b.index, b.reward))
tree_sample = lambda: rb.sampler.sample(1024, step, g)
upd = lambda: rb.sampler.update(b.index, b.reward)
win = lambda: rb.storage.window(b.index, 16)
rb.sampler.search = "cdf"
eager_ms(full, "cdf sample_into+update"); graph_ms(full, "cdf sample_into+update")
raise SystemExit
for fn, label in [(full, "sample_into+update"), (tree_sample, "tree sample"), (upd, "tree update"), (win, "window")]:
    eager_ms(fn, label); graph_ms(fn, label)
# alternative: inverse CDF over the leaves (cumsum + searchsorted)
leaves = rb.sampler.priorities()
def cdf_sample():
    cdf = torch.cumsum(leaves, 0)
    u = (torch.arange(1024, device="cuda", dtype=torch.float64) + torch.rand(1024, device="cuda", dtype=torch.float64, generator=g)) * (cdf[-1] / 1024)
    return torch.searchsorted(cdf, u, right=True).clamp_(max=leaves.numel() - 1)
eager_ms(cdf_sample, "cdf sample"); graph_ms(cdf_sample, "cdf sample")
try:
    comp = torch.compile(rb.sampler.sample, fullgraph=True)
    cs = lambda: comp(1024, step, g)
    eager_ms(cs, "compiled tree sample"); graph_ms(cs, "compiled tree sample")
except Exception as e:
    print("compile failed", type(e).__name__, str(e).splitlines()[0])
from trainer.data import make_source
src = make_source(build_config({"data": {"num_envs": 16}}), "cuda")
t=time.time()
for _ in range(50): src.collect(None, 1.0, g)
print("market collect 16 envs ms/step", round((time.time()-t)/50*1e3, 3))
