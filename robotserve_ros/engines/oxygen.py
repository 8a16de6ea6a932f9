"""OxyGen on LeRobot's SmolVLA: actions and language from one prefill (seed 001).

SmolVLA is a Mixture-of-Transformers VLA like pi0.5: a VLM prefix (SmolVLM2: images,
instruction, state) whose KV cache the action expert attends to while it denoises, and
whose LM head can decode text. LeRobot runs the prefix inside `sample_actions`; this engine
(a LeRobotEngine, LeRobot unforked) runs the same steps itself so the prefix KV outlives
the action:

- `_prefill`: LeRobot's `embed_prefix` + `vlm_with_expert.forward(fill_kv_cache=True)`,
  once per observation (§3.1 Eq. 1);
- `_denoise`: LeRobot's Euler loop over `model.denoise_step` (still wrapped by the parent,
  so the per-step updates are captured for the horizon policy) against that KV (Eq. 4);
- a row view of the same KV is the starting state of that frame's language request
  (§3.2, Alg. 1 lines 1-4): the prompt is prefilled on top of it, then tokens are decoded
  greedily with the VLM's own layers, final norm and LM head;
- `decode_frame`: every active request, from any frame or robot, advances k tokens in one
  batch (cross-frame continuous batching, §3.3 Alg. 1 lines 5-13). Request bookkeeping is
  core/kv_manager.py's; the tensors stay here.

LeRobot's cached forward does not return the KV of new tokens (`fill_kv_cache=False` only
concatenates), and its cross-attention layers cannot run the VLM stream alone, so the
decode step runs the VLM text layers here with LeRobot's `apply_rope` and attention.

Prompt tokens and generated tokens are embedded as SmolVLA embeds its instruction
(`embed_language_tokens * sqrt(hidden)`), so the language continues the prefix the way the
policy reads it. `isolated_generate` is the reference: LeRobot's own full forward over
prefix + prompt + tokens so far, no cache, one greedy token at a time.

The language side (the prefix and request KV, the text layers, `decode_frame`) lives in
engines/oxygen_decode.py; this file is the action path, requests and references.
"""
from __future__ import annotations

import math
import threading
from typing import Optional, Sequence

import numpy as np

from ..core.errors import RequestError, UnknownTask
from ..core.kv_manager import BadPrompt, LanguageState, NoObservation, UnifiedKVManager, check_context
from ..core.observation import Observation
from ..core.types import ChunkResult, InferenceRequest
from .lerobot_engine import LeRobotEngine, PolicyDirError
from .oxygen_decode import TextDecoding, _LangKV, _Prefix

DEFAULT_MAX_TOKENS = 20


class OxyGenEngine(LeRobotEngine, TextDecoding):
    """LeRobotEngine for SmolVLA with a unified KV cache: `infer` is the action path (one
    prefill per observation, kept for that frame's language), `request_language` attaches
    a language request to a round, `start_language` asks about a frame on its own, and
    `decode_frame` is one frame of batched decoding.

    tokens_per_frame: k of §3.3; max_active: language requests held at once;
    default_max_tokens: a request's token budget when it gives none; keep_frames: keep each
    task's latest prefix so a question about "the current frame" needs no new prefill."""

    name = "oxygen"
    rtc_capable = False  # its frames decode through its own prefix path, not LeRobot's RTC processor

    def __init__(self, profile=None, *, policy_dir: str, tokens_per_frame: int = 5, max_active: int = 64,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, keep_frames: bool = True, **kw) -> None:
        super().__init__(profile, policy_dir=policy_dir, **kw)
        if self.policy_type != "smolvla":
            raise PolicyDirError(policy_dir, f"the oxygen engine serves SmolVLA (a VLM prefix with an LM head), "
                                             f"not {self.policy_type}")
        if getattr(self.cfg, "rtc_config", None) is not None and self.cfg.rtc_config.enabled:
            raise PolicyDirError(policy_dir, "real-time chunking (rtc_config) is not supported by the oxygen engine")
        if int(default_max_tokens) < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
        torch = self.torch
        vwe = self.policy.model.vlm_with_expert
        self._vwe = vwe
        self._text = vwe.get_vlm_model().text_model
        self._lm_head = vwe.vlm.lm_head
        tcfg = vwe.vlm.config.text_config
        self.head_dim = int(tcfg.head_dim)
        self.context_limit = int(tcfg.max_position_embeddings)
        self._emb_scale = math.sqrt(int(tcfg.hidden_size))
        self.tokenizer = vwe.processor.tokenizer
        self.eos_id = self.tokenizer.eos_token_id
        self.default_max_tokens = int(default_max_tokens)
        self.keep_frames = bool(keep_frames)
        self.kv = UnifiedKVManager(tokens_per_frame=tokens_per_frame, max_active=max_active, free=self._free)
        self._lock = threading.RLock()  # pending requests, kept frames
        self._pending: dict = {}  # (task_id, round_id) -> LanguageState waiting for its frame's prefill
        self._frames: dict = {}  # task_id -> (round_id, _Prefix row view) of its latest frame
        self._frame_prefix: Optional[_Prefix] = None  # the batch being served (action thread)
        self.freed = 0  # requests whose KV was released
        # fn("start") / fn("end") around every action batch: the language core (core/
        # language_frames.py) decodes between them, so actions keep their frame deadline.
        self.action_listeners: list = []
        self._max_prefix = None
        self._failed: list = []  # requests whose frame could not start them (reported by the service)
        with torch.inference_mode():  # the longest prefix: this one with the instruction at its longest
            from lerobot.utils.constants import OBS_LANGUAGE_TOKENS

            obs = self.example_observation(np.random.default_rng(0))
            pre = self.pre(self._to_raw(InferenceRequest(task_id="probe", round_id=0, observation=obs)))
            row = self._prefill_observation(obs)
            lang = int(pre[OBS_LANGUAGE_TOKENS].shape[1])
            self._max_prefix = int(row.pad_masks.shape[1]) - lang + int(self.cfg.tokenizer_max_length)

    # --- action path (the parent's infer calls this) ---------------------------------------
    def _sample(self, batch: dict, noise):
        p = self.policy
        from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

        batch = p._prepare_batch(batch)
        images, img_masks = p.prepare_images(batch)
        state = p.prepare_state(batch)
        prefix = self._prefill(images, img_masks, batch[OBS_LANGUAGE_TOKENS], batch[OBS_LANGUAGE_ATTENTION_MASK], state)
        self._frame_prefix = prefix
        x = self._denoise(prefix, noise)
        actions = x[:, :, : self.cfg.action_feature.shape[0]]
        if self.cfg.adapt_to_pi_aloha:
            actions = p._pi_aloha_encode_actions(actions)
        return actions[:, : self.chunk_len]

    def _prefill(self, images, img_masks, lang_tokens, lang_masks, state) -> _Prefix:
        """PREFILL (Alg. 1 line 1): the steps of VLAFlowMatching.sample_actions before its loop."""
        from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks

        m = self.policy.model
        embs, pad, att = m.embed_prefix(images, img_masks, lang_tokens, lang_masks, state=state)
        att2d = make_att_2d_masks(pad, att)
        pos = self.torch.cumsum(pad, dim=1) - 1
        _, kv = self._vwe.forward(attention_mask=att2d, position_ids=pos, past_key_values=None,
                                  inputs_embeds=[embs, None], use_cache=True, fill_kv_cache=True)
        return _Prefix(kv, pad)

    def _denoise(self, prefix: _Prefix, noise):
        """ACTIONDENOISE (Alg. 1 line 2): LeRobot's Euler loop on the shared prefix KV. The
        cached forward only reads the KV (it concatenates), so the language view stays intact."""
        torch, m = self.torch, self.policy.model
        bsize = prefix.pad_masks.shape[0]
        n = self.cfg.num_steps
        dt = -1.0 / n
        x_t = noise
        for step in range(n):
            t = torch.tensor(1.0 + step * dt, dtype=torch.float32, device=self.device).expand(bsize)
            v_t = m.denoise_step(x_t=x_t, prefix_pad_masks=prefix.pad_masks, past_key_values=prefix.kv, timestep=t)
            x_t = x_t + dt * v_t
        return x_t

    def infer(self, batch: Sequence[InferenceRequest]) -> list[ChunkResult]:
        """Actions for the batch; then each row's prefix KV starts the language request its
        round asked for (INITSTATE + STORE, Alg. 1 lines 3-4) and is kept as the task's frame."""
        self._frame_prefix = None
        for fn in list(self.action_listeners):
            fn("start")
        try:
            out = super().infer(batch)
        finally:
            for fn in list(self.action_listeners):
                fn("end")
        prefix, self._frame_prefix = self._frame_prefix, None
        if prefix is not None:
            with self._lock:
                for i, r in enumerate(batch):
                    if self.keep_frames:
                        self._frames[r.task_id] = (r.round_id, prefix.row(i))
                    st = self._pending.pop((r.task_id, r.round_id), None)
                    if st is not None:
                        try:  # never fails the action reply: the language request ends with the error
                            self._store(st, prefix.row(i))
                        except RequestError as e:
                            st.finished, st.reason, st.error, st.kv = True, e.code, e.message, None
                            self._failed.append(st)
        return out

    def forget(self, task_id: str) -> None:
        super().forget(task_id)
        with self._lock:
            self._frames.pop(task_id, None)
            for key in [k for k in self._pending if k[0] == task_id]:
                self._pending.pop(key)

    # --- language requests -----------------------------------------------------------------
    def _tokenize(self, prompt) -> list:
        if not isinstance(prompt, str) or not prompt.strip():
            raise BadPrompt("the language prompt is empty or not text")
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if not ids:
            raise BadPrompt(f"the language prompt {prompt[:40]!r} has no tokens")
        return list(ids)

    def _budget(self, max_tokens) -> int:
        n = int(max_tokens or 0)
        return n if n > 0 else self.default_max_tokens

    def request_language(self, task_id: str, round_id: int, prompt: str, max_tokens: int = 0,
                         rid: str = "") -> LanguageState:
        """Attach a language request to round (task_id, round_id): it starts from that round's
        prefix KV when the round is served. Checks the prompt against the context limit now
        (with the longest prefix an observation can have), so the sender hears at once."""
        ids = self._tokenize(prompt)
        n = self._budget(max_tokens)
        check_context(self._max_prefix, len(ids), n, self.context_limit)
        st = LanguageState(rid=rid, task_id=task_id, max_tokens=n, prompt_tokens=len(ids))
        st.kv = ids  # token ids until the prefix exists
        with self._lock:
            if not st.rid:
                st.rid = f"lang-{task_id}-{round_id}"
            self._pending[(task_id, round_id)] = st
        return st

    def start_language(self, task_id: str, prompt: str, max_tokens: int = 0, observation=None,
                       rid: str = "") -> LanguageState:
        """A language request on its own (a planner's question): about `observation` (prefilled
        here, no actions), else about the task's latest served frame (its kept prefix KV)."""
        ids = self._tokenize(prompt)
        n = self._budget(max_tokens)
        torch = self.torch
        if observation is not None and getattr(observation, "images", None):
            with torch.inference_mode():
                prefix = self._prefill_observation(observation, task_id)
        else:
            if not task_id:
                raise NoObservation("a language request needs an observation or the task id of a robot being served")
            with self._lock:
                frame = self._frames.get(task_id)
            if frame is None:
                raise UnknownTask(f"no frame of task {task_id!r} to ask about (send an observation, or ask "
                                  f"after one of its rounds was served)")
            prefix = frame[1]
        st = LanguageState(rid=rid, task_id=task_id, max_tokens=n, prompt_tokens=len(ids))
        st.kv = ids
        self._store(st, prefix)
        return st

    def cancel_language(self, rid: str = "", task_id: str = "", round_id: Optional[int] = None) -> None:
        with self._lock:
            if task_id and round_id is not None:
                self._pending.pop((task_id, round_id), None)
        if rid:
            self.kv.remove(rid, "cancelled")

    def _inputs(self, obs: Observation, task_id: str = "question") -> tuple:
        """A standalone observation through LeRobot's preprocessing (no history kept): the
        arguments of VLAFlowMatching.embed_prefix."""
        from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

        pre = self.pre(self._to_raw(InferenceRequest(task_id=task_id or "question", round_id=0, observation=obs)))
        p = self.policy
        b = p._prepare_batch({k: pre[k] for k in [self.state_key, *self.image_keys,
                                                     OBS_LANGUAGE_TOKENS, OBS_LANGUAGE_ATTENTION_MASK]})
        images, img_masks = p.prepare_images(b)
        return images, img_masks, b[OBS_LANGUAGE_TOKENS], b[OBS_LANGUAGE_ATTENTION_MASK], p.prepare_state(b)

    def _prefill_observation(self, obs: Observation, task_id: str = "question") -> _Prefix:
        return self._prefill(*self._inputs(obs, task_id))

    def _prompt_sequence(self, observation: Observation, ids: list) -> tuple:
        """The isolated paths' one sequence: embedded prefix + prompt tokens, with SmolVLA's
        padding and attention masks (the prompt attends causally to all of it)."""
        torch = self.torch
        images, img_masks, lang, lang_mask, state = self._inputs(observation, "isolated")
        embs, pad, att = self.policy.model.embed_prefix(images, img_masks, lang, lang_mask, state=state)
        t = torch.tensor([ids], dtype=torch.long, device=self.device)
        return (torch.cat([embs, self._embed(t).to(embs.dtype)], 1), torch.cat([pad, torch.ones_like(t, dtype=torch.bool)], 1),
                torch.cat([att, torch.ones_like(t, dtype=torch.bool)], 1), int(pad.shape[1]))

    def _full_forward(self, e, pm, am, use_cache: bool):
        """LeRobot's own forward over a whole sequence (no past): last hidden state, KV."""
        from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks

        (hid, _), kv = self._vwe.forward(attention_mask=make_att_2d_masks(pm, am),
                                         position_ids=self.torch.cumsum(pm, 1) - 1, past_key_values=None,
                                         inputs_embeds=[e, None], use_cache=use_cache, fill_kv_cache=True)
        return hid, kv

    def _store(self, st: LanguageState, prefix: _Prefix) -> None:
        """INITSTATE + STORE: the request's KV starts as a view of the frame's prefix KV."""
        ids = st.kv
        pos = int(prefix.pad_masks.sum())
        try:
            check_context(pos, len(ids), st.max_tokens, self.context_limit)
        except BadPrompt:
            st.kv = None
            raise
        handle = _LangKV(prefix, self.torch.tensor([ids], dtype=self.torch.long, device=self.device))
        st.kv, st.kv_bytes = handle, handle.nbytes()
        self.kv.store(st)

    def take_failed(self) -> list:
        """Requests attached to a round that could not start (over the context, overloaded)."""
        with self._lock:
            out, self._failed = self._failed, []
        return out

    def _free(self, handle) -> None:
        """The manager let go of a request's KV: its last reference (a decode round still
        using it, when it was cancelled mid-round, holds it until the round ends)."""
        if isinstance(handle, _LangKV):
            self.freed += 1

    # --- references and baselines ----------------------------------------------------------
    def isolated_generate(self, observation: Observation, prompt: str, max_tokens: int) -> list:
        """The isolated VLM's greedy decoding (the reference of the tests): LeRobot's own
        forward over prefix + prompt + the tokens so far, recomputed for every token."""
        torch = self.torch
        ids = self._tokenize(prompt)
        out = []
        with torch.inference_mode():
            for _ in range(max_tokens):
                e, pm, am, _ = self._prompt_sequence(observation, ids + out)
                hid, _ = self._full_forward(e, pm, am, use_cache=False)
                out.append(int(self._logits(hid[:, -1]).argmax(-1)))
                if self.eos_id is not None and out[-1] == self.eos_id:
                    break
        return out

    def isolated_language(self, observation: Observation, prompt: str, max_tokens: int) -> list:
        """Language by isolated execution (the bench's baseline, §4.1): its own prefill of the
        observation and prompt in one LeRobot forward, then greedy decoding to completion at
        batch 1 (k tokens per round, rounds until done)."""
        ids = self._tokenize(prompt)
        with self.torch.inference_mode():
            e, pm, am, prefix_len = self._prompt_sequence(observation, ids)
            check_context(prefix_len, len(ids), max_tokens, self.context_limit)
            hid, kv = self._full_forward(e, pm, am, use_cache=True)
            h = _LangKV(_Prefix(kv, pm), None)
            h.next_token = int(self._logits(hid[:, -1]).argmax(-1))
        st = LanguageState(rid="", task_id="isolated", max_tokens=int(max_tokens), prompt_tokens=len(ids),
                           kv=h, kv_bytes=h.nbytes())
        self.kv.store(st)
        toks = []
        while not st.finished:
            for s, new in self.decode_frame():
                if s is st:
                    toks += new
        return toks

    def set_denoise_steps(self, steps: int) -> None:
        """Flow-matching steps S (the bench sweeps 5 and 10 on one loaded model)."""
        if int(steps) < 1:
            raise ValueError(f"denoise steps must be >= 1, got {steps}")
        self.cfg.num_steps = int(steps)

    def _install_capture(self) -> None:
        """As the parent's for SmolVLA, with the Euler step read at each call (set_denoise_steps)."""
        if self.policy_type == "smolvla":
            model = self.policy.model
            orig = model.denoise_step

            def denoise_step(*args, **kwargs):
                v_t = orig(*args, **kwargs)
                self._captured.append((-1.0 / self.cfg.num_steps) * v_t)
                return v_t

            model.denoise_step = denoise_step
            tok = getattr(model.vlm_with_expert.processor, "tokenizer", None)
            self._pad_id = int(getattr(tok, "pad_token_id", None) or 0)
        else:
            super()._install_capture()

    def close(self) -> None:
        self.kv.close()
        with self._lock:
            self._frames.clear()
            self._pending.clear()
        super().close()


__all__ = ["OxyGenEngine"]
