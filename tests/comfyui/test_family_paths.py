"""A model module that moved or vanished in a ComfyUI update, in real ComfyUI: GCache's nodes still load, one log line
names the families left out, and a model of such a family falls back to the whole-model cache loudly.

ComfyUI loads the pack the way it loads every custom node (nodes.load_custom_node), in a fresh process in which
Lumina2's model module is hidden after ComfyUI's own start-up (sys.modules entry None: importing it raises, as
for a module that is gone; the class ComfyUI already holds still builds a model, as a class that moved would).
"""
import json
import os
import subprocess
import sys

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
PACK = os.path.dirname(os.path.dirname(HERE))
HIDDEN = "comfy.ldm.lumina.model"
NODES = ["GCacheApply", "GCacheProfile", "GCachePolicy", "GCacheSearch", "GCacheLoadProfile"]

SCRIPT = r'''
import asyncio, json, logging, os, sys, types
comfy_path, here, pack, hidden = sys.argv[1:5]
sys.path[:0] = [comfy_path, here]
import torch
import comfy.cli_args
comfy.cli_args.args.cpu = not torch.cuda.is_available()
import utils.extra_config  # first, as main.py does: later comfy/ is on sys.path, and its utils.py would shadow utils/
import server
import nodes
from aiohttp import web
server.PromptServer.instance = types.SimpleNamespace(routes=web.RouteTableDef())  # the routes need a server
said = []
class Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("gcache").addHandler(Said())
logging.getLogger("gcache").setLevel(logging.INFO)
sys.modules[hidden] = None  # the model module is gone
loaded = asyncio.run(nodes.load_custom_node(pack))
out = {"loaded": loaded, "nodes": sorted(k for k in nodes.NODE_CLASS_MAPPINGS if k.startswith("GCache")),
       "left_out": [s for s in said if "left out on this ComfyUI" in s]}
import tiny_models as tm
from gcache.core.policy import Policy
m, pos, neg, lat = tm.lumina2()
said.clear()
patched = nodes.NODE_CLASS_MAPPINGS["GCacheApply"].execute(
    m, "(auto)", "model device", "remap", policy_json=Policy([1, 0, 1, 0, 0, 1]).to_json()).result[0]
latent = nodes.common_ksampler(patched, 0, 6, 3.0, "euler", "simple", pos, neg, {"samples": lat})[0]["samples"]
out["applied"] = list(said)
out["finite"] = bool(torch.isfinite(latent).all())
print("RESULT " + json.dumps(out))
'''


def test_a_hidden_model_module_leaves_its_family_out_and_the_nodes_load(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, COMFY, HERE, PACK, HIDDEN], capture_output=True, text=True,
                          timeout=600, env=env, cwd=str(tmp_path))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["loaded"] and out["nodes"] == sorted(NODES)
    assert len(out["left_out"]) == 1 and "lumina2" in out["left_out"][0], out["left_out"]
    warned = [s for s in out["applied"] if "belongs to the lumina2 family" in s]
    assert len(warned) == 1 and HIDDEN + ".NextDiT" in warned[0], out["applied"]
    assert any("whole-model fallback" in s and "computed 3/6 steps" in s for s in out["applied"]), out["applied"]
    assert out["finite"]
