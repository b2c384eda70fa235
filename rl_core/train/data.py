"""runs/<run_id>/episodes.parquet + rewards.parquet -> token samples -> padded micro batches.

The join, the checks' facts and the columns the trainer needs come from one query, sql/train/samples.sql,
sharded by rank before anything is loaded: every rank gets every episode's narrow columns (reward, baseline
keys, lengths) because the advantage baselines and DataStats are taken over the whole cycle, identically on
every rank, but only its own episodes' token ids and logprobs (row number in event_id order % world). The
advantages stay in rl_core/train/advantages.py (numpy over the narrow columns): the running per-org/task
baseline is a recursion in time order that SQL would only approximate, and with one implementation the
advantages are bit for bit what they were.

Every episode is kept: one longer than max_seq_len loses the left of its prompt (the completion and the
prompt's end, which the completion depends on most, stay); a completion that alone does not fit keeps
its first max_seq_len-1 tokens. Both are counted in DataStats, never dropped silently. Bad input (a
missing column, an episode without a reward, logprobs that do not match the tokens) raises DataError
naming the field and the event, the same on every rank (the checks run over all rows, in SQL).

Behaviour logprobs are under the distribution the server sampled from (logits / temperature, then top_p);
each sample carries its temperature so the policy's logprobs are taken under the same temperature and the
importance ratio compares like with like (rl_core/train/step.py). Temperature 0 (greedy) or unknown counts
as 1. top_p < 1 is not re-applied (the nucleus would be the new policy's, not the sampler's): such
episodes are counted in DataStats.top_p_below_one.

Batches are left-padded so that every completion ends at the last position: the model then only needs
logits for the last C+1 positions (`logits_to_keep`), C the longest completion of the batch.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rl_core.config import TrainConfig
from rl_core.duck import bind_files, connect, load_sql
from rl_core.lake import Lake
from rl_core.schema import BAD_LOGPROBS_SQL, EPISODES_SCHEMA, REWARDS_SCHEMA
from rl_core.train.advantages import compute_advantages

EPISODE_COLUMNS = ("event_id", "org_id", "ts_request", "prompt_token_ids", "completion_token_ids", "completion_logprobs")
REWARD_COLUMNS = ("event_id", "reward")
# Episode columns a file may lack: sql/train/samples.sql reads NULL for them (no task, temperature/top_p 1, credit 1)
OPTIONAL_COLUMNS = pa.schema([("task", pa.string()), ("temperature", pa.float64()), ("top_p", pa.float64()),
                              ("credit_weight", pa.float64())])
WIDE = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")


class DataError(ValueError):
    """The run's episodes or rewards cannot be trained on; the message names the field and the event."""


@dataclass
class Sample:
    event_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]
    reward: float
    advantage: float
    temperature: float = 1.0


@dataclass
class DataStats:
    """Over every episode of the run (all ranks), whichever shard the samples beside it are."""

    episodes: int = 0
    tokens: int = 0  # prompt + completion tokens after truncation
    completion_tokens: int = 0
    truncated_prompt: int = 0  # episodes whose prompt lost tokens on the left
    truncated_completion: int = 0  # episodes whose completion was cut (it alone exceeded max_seq_len)
    empty_completion: int = 0  # episodes with no completion token (kept, masked: they teach nothing)
    top_p_below_one: int = 0  # sampled with top_p < 1: their behaviour logprobs are nucleus-renormalised
    grouped: int = 0
    running: int = 0
    reward_mean: float = 0.0
    advantage_abs_mean: float = 0.0

    @property
    def truncated(self) -> int:
        return self.truncated_prompt + self.truncated_completion


@dataclass
class Batch:
    """One micro batch as plain lists (torch tensors are made by to_tensors, in the worker)."""

    input_ids: list[list[int]]  # [B][L] left-padded
    attention_mask: list[list[int]]  # [B][L]
    behaviour_logprobs: list[list[float]]  # [B][C] right-aligned
    loss_mask: list[list[int]]  # [B][C]
    advantages: list[float]  # [B]
    event_ids: list[str] = field(default_factory=list)
    temperatures: list[float] = field(default_factory=list)  # [B] sampling temperature of each row

    @property
    def completion_len(self) -> int:
        return len(self.loss_mask[0]) if self.loss_mask else 0


def load_samples(lake: Lake, run_id: str, tc: TrainConfig, rank: int = 0,
                 world: int = 1) -> tuple[list[Sample], DataStats]:
    """Rank `rank` of `world`'s samples of a run (sorted by event_id), and the whole run's DataStats.

    Token ids and logprobs of other ranks' episodes are never loaded (sql/train/samples.sql); world = 1
    (the launcher's check of the input before anything is written) loads them all.
    """
    run = lake.run(run_id)
    ep_path, rw_path = run.episodes, run.rewards
    for p in (ep_path, rw_path):
        if not lake.exists(p):
            raise DataError(f"{p}: not found in the lake ({lake.root})")
    con = connect(lake)
    try:
        bind_files(con, lake, "episodes", [lake.path(ep_path)], EPISODES_SCHEMA, located=True)
        bind_files(con, lake, "rewards", [lake.path(rw_path)], REWARDS_SCHEMA, located=True)
        return _query(con, tc, rank, world, (ep_path, rw_path))
    finally:
        con.close()


def build_samples(episodes: pa.Table, rewards: pa.Table, tc: TrainConfig, rank: int = 0,
                  world: int = 1) -> tuple[list[Sample], DataStats]:
    """load_samples for in-memory tables (tests, tools): the same query, each table's row order its file order."""
    import duckdb  # lazy: only this path needs a bare connection (no lake, no Parquet statistics)

    con = duckdb.connect()
    try:
        con.execute(BAD_LOGPROBS_SQL)  # the one logprob rule (rl_core/schema.py), as rl_core.duck.connect sets it
        con.register("episodes", _numbered(episodes))
        con.register("rewards", _numbered(rewards))
        return _query(con, tc, rank, world, ("episodes", "rewards"))
    finally:
        con.close()


def _numbered(table: pa.Table) -> pa.Table:
    """The table with `file_row_number` (its row order), as bind_files(located=True) gives a Parquet file."""
    return table.append_column("file_row_number", pa.array(np.arange(table.num_rows, dtype=np.int64)))


def _require(columns: list[str], required: tuple[str, ...], what: str) -> None:
    missing = [c for c in required if c not in columns]
    if missing:
        raise DataError(f"{what}: missing column(s) {', '.join(missing)}")


def _query(con, tc: TrainConfig, rank: int, world: int, names: tuple[str, str]) -> tuple[list[Sample], DataStats]:
    """The checks, then sql/train/samples.sql over views `episodes` and `rewards` (with file_row_number)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not a rank of a world of {world}")
    ep_columns = con.table("episodes").columns
    _require(ep_columns, EPISODE_COLUMNS, names[0])
    _require(con.table("rewards").columns, REWARD_COLUMNS, names[1])
    bad = con.execute(load_sql("train/bad_rewards.sql")).fetchone()
    if bad is not None:
        eid, reward, repeated = bad
        if repeated:
            raise DataError(f"rewards.event_id: duplicate {eid}")
        raise DataError(f"rewards.reward: not a finite number for event {eid} (got {reward!r})")
    con.register("optional_columns", OPTIONAL_COLUMNS.empty_table())
    params = {"rank": rank, "world": world}
    rows = con.sql(load_sql("train/samples.sql"), params=params).to_arrow_table()
    if rows.num_rows == 0:
        raise DataError("episodes: no rows to train on")
    temperatures = _check(rows)
    stats = _length_stats(rows, tc.max_seq_len)
    advantages = _advantages(rows, tc, "task" in ep_columns, stats)
    return _my_samples(rows, temperatures, advantages, tc.max_seq_len), stats


def _col(rows: pa.Table, name: str) -> np.ndarray:
    return rows[name].to_numpy(zero_copy_only=False)


def _check(rows: pa.Table) -> np.ndarray:
    """Raise DataError for the first bad episode in file order; else every row's sampling temperature [N].

    One row's checks go in the order the fields are read (id, prompt, logprob count, logprob values,
    temperature), so each bad input has one message whatever else is wrong further down the file.
    """
    has_reward = _col(rows, "has_reward")  # [N] bool
    if not has_reward.all():
        missing = np.flatnonzero(~has_reward)
        raise DataError(f"rewards: no reward for {len(missing)} episode(s), e.g. event "
                        f"{rows['event_id'][int(missing[0])].as_py()}")
    raw_t = pc.fill_null(rows["temperature"], 0.0).to_numpy(zero_copy_only=False)  # [N] NULL: unknown, as greedy
    with np.errstate(invalid="ignore"):
        t_bad = ~np.isfinite(raw_t) | (raw_t < 0)  # [N]
    repeated, prompt_len = _col(rows, "repeated"), _col(rows, "prompt_len")  # [N], [N]
    n_lp, n_comp, lp_bad = _col(rows, "logprobs_len"), _col(rows, "completion_len"), _col(rows, "lp_bad")  # [N] x3
    bad = repeated | (prompt_len == 0) | (n_lp != n_comp) | lp_bad | t_bad  # [N]
    if bad.any():
        i = int(np.argmax(bad))
        eid = rows["event_id"][i].as_py()
        if repeated[i]:
            raise DataError(f"episodes.event_id: duplicate {eid}")
        if prompt_len[i] == 0:
            raise DataError(f"episodes.prompt_token_ids: empty for event {eid}")
        if n_lp[i] != n_comp[i]:
            raise DataError(f"episodes.completion_logprobs: {n_lp[i]} values for {n_comp[i]} completion tokens "
                            f"(event {eid})")
        if lp_bad[i]:
            raise DataError(f"episodes.completion_logprobs: a value is not a finite logprob <= 0 (event {eid})")
        sampling_temperature(rows["temperature"][i].as_py(), eid)  # raises, naming the value
    return np.where(raw_t == 0, 1.0, raw_t)  # [N]


def _length_stats(rows: pa.Table, limit: int) -> DataStats:
    """DataStats' counts over every episode, from the lengths alone (the truncation rule of _truncate)."""
    p, c = _col(rows, "prompt_len").astype(np.int64), _col(rows, "completion_len").astype(np.int64)  # [N], [N]
    kept_c = np.minimum(c, limit - 1)  # [N] a completion keeps at most limit - 1 tokens
    return DataStats(
        episodes=rows.num_rows,
        tokens=int(np.minimum(p + kept_c, limit).sum()),
        completion_tokens=int(kept_c.sum()),
        truncated_prompt=int((p + kept_c > limit).sum()),
        truncated_completion=int((c > limit - 1).sum()),
        empty_completion=int((c == 0).sum()),
        top_p_below_one=int(_col(rows, "top_p_below_one").sum()),
    )


def _advantages(rows: pa.Table, tc: TrainConfig, has_task: bool, stats: DataStats) -> np.ndarray:
    """Advantages [N] of every episode (file order), over the whole run; fills stats' reward/advantage fields."""
    rewards = _col(rows, "reward").astype(np.float64)  # [N]
    tasks = rows["task"].to_pylist() if has_task else [""] * rows.num_rows
    running_keys = [f"{org}|{task}" for org, task in zip(rows["org_id"].to_pylist(), tasks, strict=True)]
    res = compute_advantages(
        rewards, _col(rows, "prompt_group").tolist(), running_keys, _col(rows, "order_us").astype(np.float64),
        mode=tc.advantage, decay=tc.baseline_decay, normalize=tc.normalize_advantages,
        credit=_col(rows, "credit").astype(np.float64),
    )
    stats.grouped, stats.running = res.grouped, res.running
    stats.reward_mean = float(np.mean(rewards))
    stats.advantage_abs_mean = float(np.mean(np.abs(res.advantages)))
    return res.advantages  # [N]


def _my_samples(rows: pa.Table, temperatures: np.ndarray, advantages: np.ndarray, limit: int) -> list[Sample]:
    """This rank's Samples (the rows whose wide columns the query filled), truncated, sorted by event_id."""
    mine = np.flatnonzero(_col(rows, "mine"))  # [M] row indices
    wide = rows.select(["event_id", "reward", *WIDE]).take(pa.array(mine)).to_pydict()
    samples = []
    for k, i in enumerate(mine.tolist()):
        prompt, comp, lps = _truncate(wide["prompt_token_ids"][k], wide["completion_token_ids"][k],
                                      wide["completion_logprobs"][k], limit)
        samples.append(Sample(wide["event_id"][k], prompt, comp, lps, float(wide["reward"][k]),
                              float(advantages[i]), float(temperatures[i])))
    samples.sort(key=lambda s: s.event_id)  # input order never matters: the same files give the same batches
    return samples


def _truncate(prompt: list | None, comp: list | None, lps: list | None,
              limit: int) -> tuple[list[int], list[int], list[float]]:
    """Fit prompt + completion into limit tokens: the completion keeps its first limit - 1, the prompt its end."""
    prompt, comp, lps = list(prompt or []), list(comp or []), list(lps or [])
    if len(comp) > limit - 1:
        comp, lps = comp[: limit - 1], lps[: limit - 1]
    if len(prompt) + len(comp) > limit:
        prompt = prompt[len(prompt) + len(comp) - limit:]
    return prompt, comp, [float(x) for x in lps]


def sampling_temperature(t: float | None, event_id: str) -> float:
    """The temperature to divide the policy's logits by: the logged one; 1 when unknown or greedy (0)."""
    if t is None or t == 0:
        return 1.0
    if not math.isfinite(t) or t < 0:
        raise DataError(f"episodes.temperature: {t!r} is not a temperature >= 0 (event {event_id})")
    return float(t)


def collate(samples: list[Sample], pad_id: int, masked: bool = False) -> Batch:
    """Left-pad to the longest sequence; completions right-aligned. masked=True: a batch that trains nothing."""
    seq_len = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    comp_len = max(1, max(len(s.completion_ids) for s in samples))
    seq_len = max(seq_len, comp_len + 1)  # the first completion token needs a position before it
    ids, att, beh, lmask = [], [], [], []
    for s in samples:
        seq = s.prompt_ids + s.completion_ids
        pad = seq_len - len(seq)
        ids.append([pad_id] * pad + seq)
        att.append([0] * pad + [1] * len(seq))
        cpad = comp_len - len(s.completion_ids)
        beh.append([0.0] * cpad + s.behaviour_logprobs)
        lmask.append([0] * comp_len if masked else [0] * cpad + [1] * len(s.completion_ids))
    return Batch(ids, att, beh, lmask, [0.0 if masked else s.advantage for s in samples], [s.event_id for s in samples],
                 [s.temperature for s in samples])


def plan_batches(samples: list[Sample], tc: TrainConfig, rank: int, world: int, pad_id: int,
                 total: int | None = None) -> list[Batch]:
    """This rank's micro batches for the whole run: shuffled (seeded) each epoch, padded to equal counts.

    `samples` is this rank's shard as load_samples(..., rank, world) gives it and `total` the episodes of
    all ranks (DataStats.episodes); without `total`, `samples` are all episodes and the shard is taken here
    by the query's rule (every world-th in event_id order, from rank), so both give the same plan.
    Every rank must run the same number of micro batches (each backward is a collective) and the count
    must be a multiple of grad_accum (else the tail never reaches an optimizer step): the count comes from
    `total`, and short ranks get fully masked batches, which add zero gradient. A rank keeps its shard
    across epochs; each epoch reshuffles it (seed + epoch). With world = 1 these are the batches of the
    global shuffle the trainer had before the shard moved into SQL.
    """
    if total is None:
        samples, total = sorted(samples, key=lambda s: s.event_id)[rank::world], len(samples)
    mb, ga = tc.micro_batch_size, tc.grad_accum
    n_micro = math.ceil(math.ceil(math.ceil(total / world) / mb) / ga) * ga
    batches: list[Batch] = []
    for epoch in range(tc.epochs):
        order = list(samples)
        random.Random(tc.seed + epoch).shuffle(order)
        # a masked batch still runs the model: any sample does, a one-token stand-in when the shard is empty
        filler = order[0] if order else Sample("", [pad_id], [], [], 0.0, 0.0)
        for k in range(n_micro):
            chunk = order[k * mb:(k + 1) * mb]
            batches.append(collate(chunk, pad_id) if chunk else collate([filler], pad_id, masked=True))
    return batches


def to_tensors(batch: Batch, device) -> dict:
    """The model inputs of a batch: ids, masks, position ids (from the attention mask: left padding)."""
    import torch  # lazy: heavy (torch)

    input_ids = torch.tensor(batch.input_ids, dtype=torch.long, device=device)  # [B,L]
    attention_mask = torch.tensor(batch.attention_mask, dtype=torch.long, device=device)  # [B,L]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B,L]
    comp_len = batch.completion_len
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "targets": input_ids[:, -comp_len:],  # [B,C]
        "behaviour_logprobs": torch.tensor(batch.behaviour_logprobs, dtype=torch.float32, device=device),  # [B,C]
        "loss_mask": torch.tensor(batch.loss_mask, dtype=torch.float32, device=device),  # [B,C]
        "advantages": torch.tensor(batch.advantages, dtype=torch.float32, device=device),  # [B]
        "temperature": torch.tensor(batch.temperatures or [1.0] * len(batch.advantages), dtype=torch.float32,
                                    device=device),  # [B]
        "comp_len": comp_len,
    }
