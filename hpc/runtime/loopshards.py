"""A TrainLoop's model and optimizer saved and loaded through DCP (hpc.checkpoint.dcp_engine).

    shards = LoopShards(session)
    shards.take(objects, state.get(SHARDED_KEY) if state else None)   # which objects go through DCP
    store.save(step, state, sharded=shards.saver(objects))           # each rank writes its own shards

Every rank writes and reads its own part without DCP's collectives (each rank's index part is
committed as it is, and the ranks agree on a load's outcome in hpc.runtime.resumepoint), so a
checkpoint loads under either strategy and on any world size. The engine is made on first use:
torch.distributed.checkpoint only loads for a loop that saves through it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from hpc.checkpoint import optim_state
from hpc.checkpoint.layout import marker_files
from hpc.runtime import resumepoint


class LoopShards:
    """Which of a loop's objects go through DCP (`names`: the model, then its optimizer), and the engine."""

    def __init__(self, session: Any) -> None:
        self.s = session
        self.names: tuple[str, ...] = ()
        self.engine: Any = None  # hpc.checkpoint.dcp_engine.DcpEngine once the loop saves or loads through it

    def _engine(self) -> Any:
        if self.engine is None:
            # torch.distributed.checkpoint: only for a loop that saves or loads through it
            from hpc.checkpoint.dcp_engine import DcpEngine

            self.engine = DcpEngine(self.s)
        return self.engine

    def take(self, objects: dict[str, Any], sharded: Any) -> None:
        """After a resume: the objects go through DCP when the checkpoint holds shards or they can."""
        if sharded is None and not resumepoint.through_dcp(objects):
            return
        self.names = resumepoint.sharded_objects(objects)
        self._engine()
        for name in self.names[1:]:  # the optimizer: a save then knows whether an empty
            optim_state.watch(objects[name])  # state is all it keeps

    def saver(self, objects: dict[str, Any]) -> Optional[Callable[[Path, bool], Any]]:
        """The store's hook that writes the shards into a checkpoint directory; None without DCP."""
        if self.engine is None or not self.names:
            return None

        def save(directory: Path, blocking: bool) -> Any:
            # Without DCP's collectives: each rank's index part is committed as it is (dcp_engine).
            self.engine.save(directory, *(objects[n] for n in self.names), blocking=blocking, collectives=False)
            return self.engine.wait
        return save

    def load(self, objects: dict[str, Any], where: Path, files: dict | None = None) -> str:
        """Load the model (and optimizer) from DCP's shards at `where`, checking each byte read
        against the marker's checksums (`files`: the marker the store read; None: read it here);
        '' when they match, else what did not."""
        from hpc.checkpoint.dcp_engine import ShardCorrupt  # as in _engine(): only for a loop that uses it

        self.names = resumepoint.sharded_objects(objects)
        engine = self._engine()
        files = marker_files(where) if files is None else files
        try:  # without DCP's collectives: the ranks agree on the outcome (resumepoint)
            engine.load(where, *(objects[n] for n in self.names), files=files, collectives=False)
        except (ShardCorrupt, FileNotFoundError) as err:
            return str(err)
        return ""

    def close(self) -> None:
        """The engine's group goes (a normal end, every rank here)."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def drop(self) -> None:
        """No collective: on an exception the engine's group goes with the process."""
        self.engine = None
