import sys
sys.path.insert(0, "bench")
import torch
import humming_gen as hg
import humming_gen.pipelines.warp_specialized.compose as wc
from bench_dense import graph_time_us
torch.manual_seed(0)
scheme = hg.scheme("w4a16-int4-g128")
for (n, k), ms in (((8192, 8192), (64, 128, 1024, 4096)), ((576, 7168), (256, 1024))):
    qws = [scheme.quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(4 if n == 8192 else 16)]
    variants = {}
    for flag in (False, True):
        wc.RELEASE_BY_THREAD = flag
        variants[flag] = [hg.QuantLinear.from_quantized(q) for q in qws]
    for m in ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        t = {f: [] for f in variants}
        for _ in range(3):
            for f, layers in variants.items():
                t[f].append(graph_time_us(layers, x))
        y0, y1 = variants[False][0](x), variants[True][0](x)
        print(f"{n}x{k} m={m}: lane0 {min(t[False]):.1f} us, every thread {min(t[True]):.1f} us, equal={torch.equal(y0, y1)}", flush=True)
