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
