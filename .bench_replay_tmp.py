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
torch.cuda.synchronize(); print("extend 1M rows s", time.time()-t, len(rb))
b = rb.empty_batch(1024)
step = torch.zeros((), dtype=torch.int64, device="cuda")
for _ in range(10): rb.sample_into(b, step); rb.update_priorities(b.index, b.reward)
torch.cuda.synchronize(); t=time.time()
for _ in range(200): rb.sample_into(b, step); rb.update_priorities(b.index, b.reward)
torch.cuda.synchronize(); print("eager sample+update ms", (time.time()-t)/200*1e3)
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s): rb.sample_into(b, step); rb.update_priorities(b.index, b.reward)
torch.cuda.current_stream().wait_stream(s)
gr = torch.cuda.CUDAGraph(); gr.register_generator_state(g)
with torch.cuda.graph(gr): rb.sample_into(b, step); rb.update_priorities(b.index, b.reward)
for _ in range(10): gr.replay()
torch.cuda.synchronize(); t=time.time()
for _ in range(500): gr.replay()
torch.cuda.synchronize(); print("graph sample+update ms", (time.time()-t)/500*1e3)
# collection throughput of the market source
from trainer.data import make_source
src = make_source(build_config({"data": {"num_envs": 16}}), "cuda")
t=time.time()
for _ in range(50): src.collect(None, 1.0, g)
print("market collect 16 envs ms/step", (time.time()-t)/50*1e3)
