"""save_checkpoint: every rank prepares, all agree on the tag, every rank writes its files, rank 0 commits.

    begin    every rank posts its tag (or the error that stops it); rank 0 adds the temporary folder's nonce
    written  every rank posts its files (size, sha256 of the bytes written) and slices, or its error
    commit   rank 0 checks the files against the manifest, writes it, renames the folder into place, moves
             `latest`, and posts "ok" or the reason it did not; every rank raises if it was not "ok"
Every wait is bounded (rendezvous.py), so a rank that never calls this fails the others instead of hanging them.
"""
import json
import os
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass, field

from . import commit, manifest, module_slices, safetensors_io, shards, state_files
from .errors import CheckpointDirError, CheckpointError, CheckpointTagMismatchError
from .rendezvous import Meeting, resolve_timeout
from ..accelerator.cuda import synchronize_if_used
from .layout import checkpoint_layout, param_names, states_visitor
from .tags import normalize_tag

_OK = "ok"


@dataclass
class SaveJob:
    save_dir: str
    tag: str
    rank: int
    save_latest: bool
    flags: dict
    precision: str
    shard_tensors: dict
    slices: list
    module: dict = None
    module_tensors: dict = field(default_factory=dict)   # stage 3: this rank's slices of the module weights
    module_slices: list = field(default_factory=list)
    module_info: dict = None
    engine_json: dict = None
    engine_tensors: dict = None
    nonce: str = ""
    stats: dict = field(default_factory=dict)
    visitor: object = None   # states on NVMe: the owner's visitor the shard file's Deferred tensors go through

    def close_visitor(self):
        visitor, self.visitor = self.visitor, None
        if visitor is not None:
            visitor.close()


def prepare(engine, save_dir, tag, client_state, save_latest, exclude_frozen, rank, snapshot):
    """Everything that can fail before any file is touched (tag, unsafe client_state) plus the tensors."""
    if not isinstance(save_dir, (str, os.PathLike)):
        raise CheckpointDirError(f"save_checkpoint: save_dir must be a directory path (str or os.PathLike), got "
                                 f"{type(save_dir).__name__} {save_dir!r}")
    if not os.fspath(save_dir):
        raise CheckpointDirError("save_checkpoint: save_dir is empty; pass the directory to save into")
    text = normalize_tag(tag, engine.global_steps)
    layout = checkpoint_layout(engine)
    writes_shards = rank == 0 or not layout.replicated
    tensors, slices = {}, []
    visitor = states_visitor(engine, writes=False) if writes_shards else None
    try:
        if writes_shards:
            tensors, slices = shards.collect(layout, engine.optimizer, manifest.optim_file(rank), snapshot=snapshot,
                                             use=visitor.use if visitor is not None else None)
    except BaseException:
        if visitor is not None:
            visitor.close()
        raise
    job = SaveJob(os.fspath(save_dir), text, rank, bool(save_latest),
                  {"world_size": layout.world_size, "stage": layout.stage, "replicated": layout.replicated},
                  engine.state_owner.precision.name, tensors, slices, visitor=visitor)
    if snapshot:
        job.close_visitor()   # everything was copied
    sliced = module_slices.partitioned(engine)   # stage 3: every rank writes its own slice of the weights
    if sliced:
        job.module_tensors, job.module_slices = module_slices.collect(
            engine, param_names(engine.module), rank, exclude_frozen, snapshot)
    if rank == 0:
        job.engine_json, job.engine_tensors = state_files.engine_state(engine, client_state)
        if snapshot:
            job.engine_tensors = {k: v.clone() for k, v in job.engine_tensors.items()}
        job.module = state_files.module_tensors(engine, exclude_frozen, snapshot, buffers_only=sliced)
        job.module_info = state_files.module_info(engine.module)
    if snapshot:
        synchronize_if_used()      # the host copies from a GPU were asynchronous
    return job


def begin(engine, save_dir, tag, client_state=None, save_latest=True, exclude_frozen=False, snapshot=False,
          timeout_s=None):
    """Prepare on every rank and agree on the tag. Returns (job, meeting); raises on every rank on any error."""
    meeting = Meeting(resolve_timeout(engine.config, timeout_s))
    job, error = None, None
    try:
        job = prepare(engine, save_dir, tag, client_state, save_latest, exclude_frozen, meeting.rank, snapshot)
    except Exception as err:   # reported to the other ranks first, so none of them waits for this one
        error = err
    try:
        _agree(engine, job, error, meeting)
    except BaseException:
        if job is not None:
            job.close_visitor()
        raise
    return job, meeting


def _agree(engine, job, error, meeting):
    post = {"tag": job.tag if job else None, "nonce": uuid.uuid4().hex[:12],
            "error": f"{type(error).__name__}: {error}" if error else None}
    posts = [json.loads(v) for v in meeting.all_gather("begin", json.dumps(post).encode())]
    if error is not None:
        raise error
    failed = [(r, p["error"]) for r, p in enumerate(posts) if p["error"]]
    if failed:
        r, why = failed[0]
        raise CheckpointError(f"save_checkpoint: rank {r} cannot save ({why}); no rank saved")
    _check_tags(engine, job, posts, meeting.rank)
    job.nonce = posts[0]["nonce"]


def _check_tags(engine, job, posts, rank):
    tags = [p["tag"] for p in posts]
    if len(set(tags)) == 1:
        return
    other = next(r for r, t in enumerate(tags) if t != tags[0])
    mode = getattr(getattr(engine.config, "checkpoint", None), "tag_validation", "Warn")
    what = (f"ranks passed different checkpoint tags: rank 0 {tags[0]!r}, rank {other} {tags[other]!r}")
    if mode == "Fail":
        raise CheckpointTagMismatchError(
            f"save_checkpoint: {what}. Pass the same tag on every rank (a tag from loss.item() differs per rank: "
            "reduce the loss first, or use the step number); checkpoint.tag_validation is Fail, so no rank saved")
    # Warn (DeepSpeed's default) and Ignore save, as DeepSpeed does; one checkpoint folder holds every rank's
    # shards, so all of them go under rank 0's tag (in DeepSpeed's layout rank 0's folder is the loadable one)
    if mode == "Warn" or job.tag != tags[0]:
        warnings.warn(f"{what}; checkpoint.tag_validation is {mode}, so rank {rank} saves under rank 0's tag "
                      f"{tags[0]!r}. Pass the same tag on every rank (e.g. the step number)")
    job.tag = tags[0]


def write_and_commit(job, meeting):
    """Write this rank's files, then rank 0 commits. Raises on every rank if any rank failed."""
    t0 = time.perf_counter()
    tmp = commit.tmp_dir(job.save_dir, job.tag, job.nonce)
    local_error, report = None, None
    try:
        os.makedirs(tmp, exist_ok=True)
        commit.fault_point("begin", job.rank)
        report = {"files": _write_files(job, tmp), "slices": job.slices, "module_slices": job.module_slices,
                  "error": None}
    except Exception as err:
        local_error = err
        report = {"error": f"{type(err).__name__}: {err}"}
    finally:
        job.close_visitor()
    commit.fault_point("written", job.rank)
    reports = meeting.gather("written", json.dumps(report).encode())
    if meeting.rank == 0:
        outcome = _commit(job, tmp, [json.loads(r) for r in reports])
        meeting.broadcast("commit", outcome.encode())
    else:
        outcome = meeting.broadcast("commit").decode()
    job.stats.update(write_s=time.perf_counter() - t0,
                     bytes=sum(f["size"] for f in (report.get("files") or {}).values()))
    if local_error is not None:
        raise local_error
    if outcome != _OK:
        raise CheckpointError(outcome)
    return os.path.join(job.save_dir, job.tag)


def _write_files(job, tmp):
    files = {}

    def fault(stage):
        commit.fault_point(f"shard_{stage}", job.rank)

    def put(name, tensors, **kw):
        path = os.path.join(tmp, name)
        # the sha256 is taken of the bytes as they are written; reading the file back would only read the page
        # cache we just filled, so it is not repeated (the manifest's checksums are checked at every load)
        files[name] = safetensors_io.write_file(path, tensors, **kw)

    if job.shard_tensors or job.slices:
        put(manifest.optim_file(job.rank), job.shard_tensors, fault=fault)
        job.close_visitor()   # (write_and_commit closes it on an error)
    if job.module_slices:
        put(module_slices.model_file(job.rank), job.module_tensors)
    if job.rank == 0:
        put(manifest.MODEL_FILE, job.module)
        if job.engine_tensors:
            put(manifest.ENGINE_TENSORS, job.engine_tensors)
        files[manifest.ENGINE_FILE] = state_files.dump_json(os.path.join(tmp, manifest.ENGINE_FILE),
                                                            job.engine_json)
    return files


def _commit(job, tmp, reports):
    """Rank 0: check, write the manifest, rename into place, move `latest`. Returns "ok" or the reason."""
    failed = [(r, rep["error"]) for r, rep in enumerate(reports) if rep.get("error")]
    if failed:
        shutil.rmtree(tmp, ignore_errors=True)
        return (f"save_checkpoint: rank {failed[0][0]} failed to write its files ({failed[0][1]}); the checkpoint "
                f"{job.tag!r} was not committed and `latest` is unchanged")
    try:
        extra = {"module_file": manifest.MODEL_FILE, "engine_file": manifest.ENGINE_FILE, **job.module_info}
        sliced = module_slices.manifest_entries(reports)
        if sliced:
            extra["module_params"] = sliced
        m = manifest.build(job.tag, job.flags, job.precision, reports, extra)
        for name, info in m["files"].items():
            path = os.path.join(tmp, name)
            size = os.path.getsize(path) if os.path.exists(path) else None
            if size != info["size"]:
                raise CheckpointError(f"{path}: is {size} bytes on disk, the writer reported {info['size']}")
        commit.fault_point("before_manifest", 0)
        manifest.write(os.path.join(tmp, manifest.MANIFEST), m)
        commit.fault_point("before_rename", 0)
        commit.rename_into_place(tmp, os.path.join(job.save_dir, job.tag), job.nonce)
        commit.fault_point("before_latest", 0)
        if job.save_latest:
            commit.write_latest(job.save_dir, job.tag)
        commit.fault_point("committed", 0)
        _remove_stale(job.save_dir, job.nonce)
    except Exception as err:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"save_checkpoint: rank 0 could not commit {job.tag!r}: {type(err).__name__}: {err}"
    return _OK


def _remove_stale(save_dir, nonce):
    """Temporary folders of saves that were killed (they never became a checkpoint)."""
    for name in os.listdir(save_dir):
        if name.startswith(".tmp-") and not name.endswith(nonce):
            shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)
