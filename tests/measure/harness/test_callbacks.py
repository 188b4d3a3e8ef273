"""Framework callbacks: Lightning and Keras training loops measured by the same meter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from test_bench import TRAIN_FLOPS_PER_SAMPLE  # noqa: E402  (the digits CNN's closed form)


@pytest.mark.slow
def test_lightning_callback_on_digits(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from flopcount.measure.harness.callbacks.lightning import MeterCallback
    from flopcount.models.digits import digits_cnn
    from flopcount.workloads.digits import load_data

    xtr, ytr, xte, yte = load_data()

    class Digits(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = digits_cnn()
            self.example_input_array = torch.zeros(32, 1, 8, 8)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_acc", (self(x).argmax(1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=3e-3)

    torch.manual_seed(0)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr), batch_size=32, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xte, yte), batch_size=360)
    logged = []

    class Logger(pl.loggers.logger.Logger):
        name, version = "test", 0

        def log_metrics(self, metrics, step=None):
            logged.append(dict(metrics))

        def log_hyperparams(self, *a, **k):
            pass

    cb = MeterCallback(monitor="val_acc", target_quality=0.9, quality_exponent=5, warmup_steps=3, window_steps=10,
                       energy=False)
    trainer = pl.Trainer(max_epochs=3, callbacks=[cb], logger=Logger(), enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                         accelerator="cpu", devices=1)
    trainer.fit(Digits(), train, val)
    r = cb.result
    assert r.flops_per_sample == TRAIN_FLOPS_PER_SAMPLE
    assert r.samples == 3 * 1437 and r.epochs == 3 and len(r.qualities) == 3
    assert r.flops == pytest.approx(r.samples_per_s["total"] * TRAIN_FLOPS_PER_SAMPLE, rel=1e-12)
    assert any("flopcount/epoch_flops" in m for m in logged) and any("flopcount/flops" in m for m in logged)
    assert r.quality == pytest.approx(r.qualities[-1]["value"]) and r.quality > 0.5


@pytest.mark.slow
def test_keras_callback_counts_and_times(tmp_path):
    keras = pytest.importorskip("keras")
    pytest.importorskip("tf2onnx")
    import numpy as np

    from flopcount.measure.harness.callbacks.keras import MeterCallback
    from flopcount.workloads.digits import load_data

    xtr, ytr, xte, yte = (t.numpy() for t in load_data())
    xtr, xte = xtr.reshape(len(xtr), 64), xte.reshape(len(xte), 64)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    cb = MeterCallback(batch_size=32, samples_per_epoch=1437, monitor="val_accuracy", warmup_steps=2,
                       window_steps=10, energy=False)
    model.fit(xtr, ytr.astype(np.int64), batch_size=32, epochs=2, validation_data=(xte, yte.astype(np.int64)),
              callbacks=[cb], verbose=0)
    r = cb.result
    # Dense 64->32 (+bias), ReLU, Dense 32->10 (+bias): forward 2*64*32 + 32 + 32 + 2*32*10 + 10; backward: the
    # first layer (fed by data) dW + db, ReLU 1 per element, the second dX + dW + db
    forward = 2 * 64 * 32 + 32 + 32 + 2 * 32 * 10 + 10
    backward = (2 * 64 * 32 + 32) + 32 + (2 * 2 * 32 * 10 + 10)
    assert r.flops_per_sample == forward + backward
    assert r.samples == 2 * 1437 and r.epochs == 2 and len(r.qualities) == 2
    assert r.flops == pytest.approx(r.samples_per_s["total"] * (forward + backward), rel=1e-12)


@pytest.mark.slow
def test_lightning_callback_beside_throughput_monitor(tmp_path):
    """Both on one run whose steps take STEP_S and whose batches take GAP_S to load: ThroughputMonitor times whole batch periods (batch end to
    batch end, load included), the meter's window spans N steps and the N - 1 loads between them, not the load
    before its first step. So the meter reads N (d + g) / (N d + (N - 1) g) times ThroughputMonitor's rate."""
    import time

    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import ThroughputMonitor
    from lightning.pytorch.trainer.states import RunningStage

    from flopcount.measure.harness.callbacks.lightning import MeterCallback

    GAP_S, STEP_S, B, N, STEPS = 0.03, 0.01, 16, 5, 46  # sleeps dominate: a shared machine's noise stays small

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return STEPS * B

        def __getitem__(self, i):
            if i % B == 0:
                time.sleep(GAP_S)  # one sleep per batch: the input pipeline's stall
            return torch.ones(8), torch.tensor(i % 2)

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 2)

        def training_step(self, batch, _):
            x, y = batch
            time.sleep(STEP_S)
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def attempt() -> str | None:
        """One run; None where every relation holds, else what broke it."""
        ours = MeterCallback(flops_per_sample=100.0, warmup_steps=1, window_steps=N, energy=False, peak_flops=1e9)
        theirs = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].shape[0], window_size=20)  # late batches
        trainer = pl.Trainer(max_epochs=1, callbacks=[ours, theirs], logger=False, enable_progress_bar=False,
                             enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                             accelerator="cpu", devices=1)
        trainer.fit(Tiny(), torch.utils.data.DataLoader(Slow(), batch_size=B, num_workers=0))
        tm = theirs._throughputs[RunningStage.TRAINING].compute()["device/samples_per_sec"]
        r = ours.result
        windows = ours.meter.snapshot().windows
        d = r.step_time_s  # median step
        g = sum(w.span - sum(w.durations) for w in windows) / sum(w.steps - 1 for w in windows)  # mean gap
        if not (g >= GAP_S):  # the load sits between steps, outside them
            return "g >= GAP_S"
        predicted = N * (d + g) / (N * d + (N - 1) * g)  # the meter's rate over ThroughputMonitor's
        why = (f"meter {r.samples_per_s['per_rank']:.1f}/s, monitor {tm:.1f}/s, step {d * 1e3:.2f} ms, "
               f"gap {g * 1e3:.2f} ms")
        if not (r.samples_per_s["per_rank"] > tm):  # the meter leaves one load per window out
            return "r.samples_per_s['per_rank'] > tm: " + why
        if not (r.samples_per_s["per_rank"] / tm == pytest.approx(predicted, rel=0.15)):
            return "r.samples_per_s['per_rank'] / tm == pytest.approx(predicted, rel=0.15): " + why
        if not (tm == pytest.approx(B / (d + g), rel=0.2)):  # ThroughputMonitor: one batch per whole period
            return "tm == pytest.approx(B / (d + g), rel=0.2): " + why
        return None

    # wall-clock rates on a shared machine: a run that another process slowed may break the relations; three
    # runs that all break them do not come from noise
    failures = []
    for _ in range(3):
        failure = attempt()
        if failure is None:
            return
        failures.append(failure)
    pytest.fail("; ".join(failures))


@pytest.mark.slow
def test_keras_mfu_divides_by_tensorflows_own_ceiling(tmp_path, monkeypatch):
    keras = pytest.importorskip("keras")
    tf = pytest.importorskip("tensorflow")
    import numpy as np

    from flopcount.measure.harness.callbacks.keras import MeterCallback
    from flopcount.measure.machine.devices import cpu_cores

    monkeypatch.setenv("FLOPCOUNT_CACHE", str(tmp_path))  # measured now, not read from another run's cache
    x = np.random.default_rng(0).normal(size=(512, 64)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = MeterCallback(batch_size=32, flops_per_sample=1e4, warmup_steps=2, window_steps=4, energy=False)
    model.fit(x, y, batch_size=32, epochs=1, callbacks=[cb], verbose=0)
    r = cb.result
    threads = tf.config.threading.get_intra_op_parallelism_threads() or cpu_cores()
    assert "tensorflow" in r.peak_source and f"{threads} thread" in r.peak_source  # TF's matmul, TF's threads
    assert "torch" not in r.peak_source
    assert r.mfu == pytest.approx(r.flops / r.peak_flops, rel=1e-12)
