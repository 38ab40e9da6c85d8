"""TensorFlow/Keras itself: the final outputs, named as the TensorFlow frontend names them.

Running a SavedModel runs its code (restore and initializer functions too), so graphs holding ops that
reach files or Python are refused unless the caller allows them; Keras files load in safe mode."""
from __future__ import annotations

from pathlib import Path

from .base import Runner


class TfRunner(Runner):
    name = "tensorflow"

    def __init__(self, path: Path, threads: int | None, shapes: dict, reference: bool = True,
                 allow_io: bool = False):
        from ..frontends.tensorflow import _tf
        self.tf, self.path, self.shapes, self.graph = _tf(), path, shapes, None
        if not allow_io and path.suffix.lower() not in (".keras", ".h5", ".hdf5"):
            from ..frontends.tensorflow.saved_model import io_ops_in, refuse_io
            refuse_io(path, io_ops_in(path), " unless --allow-io-ops says so (TensorFlow runs them when it "
                                             "loads or runs the model)")

    def run(self, feeds):
        tf, source = self.tf, self.path
        if source.is_dir():
            fn = tf.saved_model.load(str(source)).signatures["serving_default"]
            out = fn(**{k: tf.constant(v) for k, v in feeds.items()})
            return {k: v.numpy() for k, v in out.items()}
        if source.suffix.lower() in (".keras", ".h5", ".hdf5"):
            import keras
            model = keras.models.load_model(str(source), compile=False, safe_mode=True)
            xs = [feeds[t.name.split(":")[0]] for t in model.inputs]
            out = model(xs if len(xs) > 1 else xs[0], training=False)
            flat = [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
            return dict(zip(["output"] if len(flat) == 1 else [f"output_{k}" for k in range(len(flat))], flat))
        from ..frontends.tensorflow import _from_graphdef
        gd, specs, outputs = _from_graphdef(tf, source, self.shapes)
        fn = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(gd, name=""), [])
        pruned = fn.prune([fn.graph.get_tensor_by_name(f"{op}:0") for op, _, _ in specs],
                          [fn.graph.get_tensor_by_name(ref) for ref, _ in outputs])
        vals = pruned(*[tf.constant(feeds[public]) for _, public, _ in specs])
        return {public: v.numpy() for (_, public), v in zip(outputs, vals)}
