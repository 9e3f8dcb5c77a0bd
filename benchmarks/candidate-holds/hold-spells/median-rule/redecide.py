import sys, torch
src, dst, rule = sys.argv[1:4]
p = torch.load(src, map_location="cpu", weights_only=True)
p["config"]["decision"] = rule
torch.save(p, dst)
