"""Dataset scoring on Ray Data: `probserve score INPUT --model M --output OUT`, or
`score_dataset(...)` from Python, on the Ray cluster that serves probserve.

The input is cut into shards (serve_app.batch.dataset); Ray Data hands them to a pool of
scorer actors, each of which reads its shard through pyarrow's filesystems, admits every
document as the online API does, sends them to the model's replicas through Serve's handle
(no HTTP, no JSON: the engine's arrays become Arrow columns) and writes the shard's part of
the output, renamed into place whole. A rerun skips the parts that exist, so a run that
stopped (a crash, Ctrl-C) goes on where it was. A scorer that dies is restarted by Ray and its
shard sent again; a refusal that says to wait (the model's queue full, its replica replaced)
is retried after a pause.
"""

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from serve_app.batch import dataset
from serve_app.batch.dataset import PartColumns, ScoreOptions, Shard
from serve_app.config import AppConfig, model_deployment_name
from serve_app.engine.transient import TRANSIENT
from serve_app.engine.wire import Adapter, EngineRequest, EngineResult, routed
from serve_app.errors import APIError, invalid
from serve_app.store.home import keep_ray_token_at_home, probserve_home
from serve_app.text.vocabulary import Vocabulary

APP_NAME = "probserve"
SETTINGS = "_probserve_score.json"  # in the output: what its parts were scored with
RETRY_S = 1.0
RETRY_FOR_S = 600.0  # a model without a replica for this long fails the run


@dataclass(frozen=True)
class ScoreRun:
    """A finished run: documents scored and refused, the parts written and found done."""

    documents: int
    refused: int
    scored_tokens: int
    parts_written: int
    parts_skipped: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.scored_tokens / self.seconds if self.seconds else 0.0


class ShardScorer:
    """A Ray Data actor: a shard in, its part written, its counts out."""

    def __init__(self, input_uri: str, output_uri: str, options: ScoreOptions, app_name: str,
                 in_flight: int):
        from ray import serve

        self.input_fs, _ = pafs.FileSystem.from_uri(input_uri)
        self.output_fs, self.output = pafs.FileSystem.from_uri(output_uri)
        self.options, self.in_flight = options, in_flight
        ingress = serve.get_deployment_handle("Ingress", app_name)
        config: AppConfig = ingress.app_config.remote().result()
        # A model, or an adapter on one: configured, or loaded by the run's tenant.
        served = ingress.served_to.remote(options.tenant, options.model).result()
        self.model, self.adapter = served.model, Adapter.of(served)
        self.priority = config.batch.priority  # background work, as a batch's lines
        self.ingress = config.ingress
        self.vocab = Vocabulary.load(self.model.resolved_path())
        self.replica = serve.get_deployment_handle(model_deployment_name(self.model.name), app_name)
        # Each thread waits on one document's call: Serve's handle sends them from its own loop.
        self.senders = ThreadPoolExecutor(in_flight, thread_name_prefix="probserve-score")

    def __call__(self, batch: pa.Table) -> pa.Table:
        (shard,) = [Shard(**row) for row in batch.to_pylist()]
        id_column = self.options.id_column
        wanted = [self.options.column, *([id_column] if id_column else [])]
        documents = dataset.read_shard(self.input_fs, shard, wanted)
        id_type = pa.array([d.get(id_column) for d in documents]).type if id_column else pa.null()
        counts = {"index": shard.index, "documents": shard.rows, "refused": 0, "tokens": 0}
        with self.part_writer(shard.index) as write:
            # `in_flight` documents at a time: a group's rows (the full vocabulary's too) are
            # all this actor holds.
            for start in range(0, len(documents), self.in_flight):
                columns = PartColumns.empty(self.options, id_type, self.vocab.logits_size)
                self.score_group(documents[start:start + self.in_flight], shard.first_row + start, columns)
                write(columns.table())
                counts["refused"] += columns.refused()
                counts["tokens"] += columns.scored_tokens()
        return pa.table({name: [value] for name, value in counts.items()})

    def score_group(self, documents: list[dict], first_row: int, columns: PartColumns) -> None:
        id_column = self.options.id_column
        answers = self.senders.map(self.answer, documents)
        for row, (document, answer) in enumerate(zip(documents, answers), first_row):
            document_id = document.get(id_column) if id_column else None
            if isinstance(answer, APIError):
                columns.add(row, document_id, None, answer)
            else:
                columns.add(row, document_id, dataset.document_scores(answer, self.options))

    def answer(self, document: dict) -> EngineResult | APIError:
        """The document's result, or the error the API would answer it with. A refusal that
        says to wait (the model's queue full, its replica replaced) is sent again, for up to
        RETRY_FOR_S."""
        try:
            request = dataset.admit_document(document, self.options, self.model.capabilities,
                                             self.ingress, self.vocab, self.priority, self.adapter)
            give_up = time.monotonic() + RETRY_FOR_S
            while True:
                try:
                    return self.result(dataclasses.replace(request, sent_at=time.time()))
                except TRANSIENT:
                    if time.monotonic() > give_up:
                        raise
                    time.sleep(RETRY_S)
        except APIError as error:
            return error

    def result(self, request: EngineRequest) -> EngineResult:
        replica = routed(self.replica, request)
        if not self.options.full_vocab:
            return replica.options(_by_reference=False).generate.remote(request).result()
        # The replica's stream: each window's result, then its rows' chunks.
        windows, chunks = [], []
        for item in replica.options(stream=True).generate_full_vocab.remote(request):
            if isinstance(item, EngineResult):
                windows.append(item)
            else:
                chunks.append(item)
        last = windows[-1].after(windows[:-1])
        return dataclasses.replace(last, full_vocab=last.full_vocab.with_chunks(chunks))

    @contextmanager
    def part_writer(self, index: int):
        """A writer of the part's row groups under a hidden name, renamed when all are
        written: a part that exists is whole."""
        final = f"{self.output}/{dataset.part_name(index)}"
        hidden = f"{self.output}/.{dataset.part_name(index)}.writing"
        writer = None

        def write(table: pa.Table) -> None:
            nonlocal writer
            writer = writer or pq.ParquetWriter(sink, table.schema)
            writer.write_table(table)

        with self.output_fs.open_output_stream(hidden) as sink:
            yield write
            writer.close()
        self.output_fs.move(hidden, final)


def run_settings(options: ScoreOptions, files: list[pafs.FileInfo], shard_rows: int) -> dict:
    return {"options": dataclasses.asdict(options), "shard_rows": shard_rows,
            "input": [[f.path, f.size, f.mtime_ns] for f in files]}


def claim_output(fs: pafs.FileSystem, folder: str, settings: dict) -> None:
    """The output folder, made for this run, or one a run with the same settings and input
    began (whose parts are kept); else refused, so that no parts of two runs mix."""
    path = f"{folder}/{SETTINGS}"
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_stream(path) as source:
            if orjson.loads(source.read()) != orjson.loads(orjson.dumps(settings)):
                raise invalid("output", f"{folder} holds parts of a run with other settings or "
                              "another input: choose another --output, or delete it to start over",
                              "output_in_use")
        return
    fs.create_dir(folder, recursive=True)
    if fs.get_file_info(pafs.FileSelector(folder)):
        raise invalid("output", f"{folder} is not empty and holds no run of probserve score: "
                      "choose another --output", "output_in_use")
    with fs.open_output_stream(path) as sink:
        sink.write(orjson.dumps(settings))


def score_dataset(input_uri: str, output_uri: str, options: ScoreOptions, *, address: str | None = None,
                  app_name: str = APP_NAME, shard_rows: int = 64, scorers: int = 1, in_flight: int = 16,
                  scorer_cpus: float = 0.25, progress: bool = True) -> ScoreRun:
    """Scores every document of the input into Parquet parts under the output folder (a local
    path or any URL pyarrow's filesystems take), on the Ray cluster at `address` (that of
    this process when Ray runs here already; else `auto`)."""
    import ray
    import ray.data
    from ray import serve
    from tqdm import tqdm

    options.check()
    started = time.monotonic()
    input_uri, output_uri = dataset.absolute(input_uri), dataset.absolute(output_uri)
    input_fs, input_path = pafs.FileSystem.from_uri(input_uri)
    output_fs, output_path = pafs.FileSystem.from_uri(output_uri)
    files = dataset.input_files(input_fs, input_path)
    shards = dataset.plan_shards(input_fs, files, shard_rows)
    claim_output(output_fs, output_path, run_settings(options, files, shard_rows))
    done = dataset.finished_parts(output_fs, output_path)
    todo = [s for s in shards if s.index not in done]
    if not ray.is_initialized():
        keep_ray_token_at_home(probserve_home())  # the token `probserve serve` made
        ray.init(address=address or "auto", configure_logging=False, log_to_driver=False)
    # What --model names, before any work: refused as the run's requests would be.
    serve.get_deployment_handle("Ingress", app_name).served_to.remote(options.tenant, options.model).result()
    counts = {"documents": 0, "refused": 0, "tokens": 0}
    bar = tqdm(total=sum(s.rows for s in todo), unit="doc", disable=not progress,
               desc=f"scoring with {options.model}")
    if todo:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        shards_ds = ray.data.from_items([dataclasses.asdict(s) for s in todo], override_num_blocks=len(todo))
        # A scorer that dies is restarted and its shard sent again: Ray Data's actor pools
        # default to max_restarts=-1 and max_task_retries=-1.
        scored = shards_ds.map_batches(
            ShardScorer, batch_size=1, batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=scorers), num_cpus=scorer_cpus,
            fn_constructor_kwargs={"input_uri": input_uri, "output_uri": output_uri, "options": options,
                                   "app_name": app_name, "in_flight": in_flight})
        for part in scored.iter_rows():
            for name in counts:
                counts[name] += int(part[name])
            bar.update(int(part["documents"]))
            bar.set_postfix(tokens=counts["tokens"], refused=counts["refused"])
    bar.close()
    return ScoreRun(counts["documents"], counts["refused"], counts["tokens"], len(todo), len(done),
                    time.monotonic() - started)
