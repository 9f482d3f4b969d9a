"""Starting the worker: the command line, the interface check, /health
while the engine loads."""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest

from .support import FIXTURE, Worker, run_cli


def base(stage: str = "0") -> list[str]:
    return ["standin-model", "--deploy-config", FIXTURE, "--stage-id", stage, "--host", "127.0.0.1", "--port", "0"]


class StartupTest(unittest.TestCase):
    def assertRefused(self, args: list[str], want: str, env: dict[str, str] | None = None) -> None:
        p = run_cli(args, env)
        self.assertEqual(p.returncode, 2, p.stderr)
        lines = p.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertIn(want, lines[0])
        self.assertTrue(lines[0].startswith("omnipd_stage: "), lines[0])

    def test_missing_interface_is_one_line_and_status_2(self) -> None:
        for stage, name in (("0", "vllm_omni.entrypoints.async_omni.AsyncOmni.abort"),
                            ("1", "vllm_omni.model_executor.stage_input_processors.qwen3_omni.thinker2talker"),
                            ("2", "vllm_omni.inputs.data.OmniTokensPrompt"),
                            ("0", "vllm_omni.config.resolver.resolve_omni_config"),
                            ("1", "vllm.sampling_params.SamplingParams"),
                            ("0", "vllm.entrypoints.chat_utils.parse_chat_messages_async")):
            with self.subTest(missing=name):
                p = run_cli(base(stage), {"OMNIPD_STANDIN_DROP": name})
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertEqual(p.stderr, f"omnipd_stage: vllm-omni 0.32.0 lacks {name} (written against "
                                           "vllm-omni v0.32.0); install v0.32.0 or newer\n")

    def test_bad_flags_are_refused_with_one_line(self) -> None:
        cases = [
            (base() + ["--port", "x"], "--port"),
            (["standin-model", "--stage-id", "0"], "--deploy-config"),
            (base() + ["--kv-transfer-config", "{not json"], "--kv-transfer-config"),
            (base() + ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_bogus"}'], "kv_role"),
            (base() + ["--kv-transfer-config", '{"kv_role":"kv_producer"}'], "kv_connector"),
            (base() + ["--tensor-parallel-size", "0"], "--tensor-parallel-size"),
            (base() + ["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
            (base() + ["stray"], "stray"),
            (base("7"), "--stage-id 7"),
            (base("1") + ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'],
             "is for a Thinker stage"),
            (["standin-model", "--deploy-config", "/nonexistent.yaml", "--stage-id", "0"], "/nonexistent.yaml"),
        ]
        for args, want in cases:
            with self.subTest(args=args[-2:]):
                self.assertRefused(args, want)

    def test_unknown_connector_fails_the_engine_load(self) -> None:
        p = run_cli(base() + ["--kv-transfer-config", '{"kv_connector":"NoSuchConnector","kv_role":"kv_producer"}'])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("Unsupported connector type: NoSuchConnector", p.stderr)

    def test_engine_flags_reach_the_stage(self) -> None:
        w = Worker(0, "--max-model-len", "1024", "--enforce-eager", "--no-enable-prefix-caching",
                   "--max-num-seqs", "8", "--served-model-name", "omni")
        try:
            loaded = w.wait_record(lambda r: r["event"] == "loaded", "the engine load")
            args = loaded["engine_args"]
            self.assertEqual((args["max_model_len"], args["enforce_eager"], args["enable_prefix_caching"],
                              args["max_num_seqs"], args["stage_id"], args["engine_input_source"],
                              args["final_output"], args["model_stage"]),
                             (1024, True, False, 8, 0, [], True, "thinker"))
            self.assertEqual(args["max_num_batched_tokens"], 32768)  # from the deploy config
            status, out = w.post("/v1/completions", {"model": "omni", "prompt": "x", "max_tokens": 1})
            self.assertEqual(status, 200, out)
            self.assertEqual(out["model"], "omni")
        finally:
            w.stop()

    def test_health_is_503_while_the_engine_loads(self) -> None:
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, True)
        gate = os.path.join(tmp, "gate")
        w = Worker(0, env={"OMNIPD_STANDIN_LOAD_GATE": gate}, wait=False)
        try:
            w.wait_health(503)
            status, out = w.post("/v1/completions", {"prompt": "x"})
            self.assertEqual(status, 503, out)
            open(gate, "w").close()
            w.wait_health(200)
        finally:
            w.stop()


if __name__ == "__main__":
    unittest.main()
