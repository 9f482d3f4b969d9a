"""omnipd's stage worker for vllm-omni: one process per stage instance of a
Qwen3-Omni pipeline (Thinker prefill, Thinker decode, Talker, Code2Wav) that
runs vllm-omni's model code for its stage and serves omnipd's contracts
(vLLM's OpenAI API for a Thinker stage, omnipd's stage API for the Talker
and Code2Wav, omnipd's conditioning stash for the Thinker's rows)."""
