"""Faster R-CNN with a ResNet-50 backbone for HPC AI500's extreme-weather analytics, in plain PyTorch.

HPC AI500 V2.0 trains a Faster R-CNN on the ExtremeWeather climate dataset: 16-channel 768x1152 fields, four event
classes (tropical depression, tropical cyclone, extratropical cyclone, atmospheric river) plus background. This
module builds that detector without torchvision and without weights, in a form whose *training* graph exports to
ONNX (TorchScript exporter, ``flopcount.from_torch(..., mode="train")``) and counts with no unsupported operator.

Design choices (each one changes the FLOP count; ``benchmarks/detector.py`` prints what each costs)
----------------------------------------------------------------------------------------------------
**Backbone (ResNet-50 C4).** The stem and stages 1-3 (res2-res4, blocks 3, 4, 6) of ResNet-50 v1.5, built from
:class:`flopcount.models.resnet.Bottleneck`, with a 16-channel 7x7/2 stem convolution: features of 1024 channels at
stride 16 (48x72 for a 768x1152 image). Every layer is trained and BatchNorm uses batch statistics (the ONNX graph
cannot say "frozen"; tf-faster-rcnn freezes the stem and res2, see the benchmark for what that removes).

**RPN.** As in the ResNet paper's and tf-faster-rcnn's C4 detector: a 3x3 convolution to ``rpn_channels`` (512)
with ReLU, then 1x1 convolutions to one objectness logit per anchor (sigmoid form, as torchvision; tf-faster-rcnn's
2-way softmax adds A more output channels) and 4 box deltas per anchor. 9 anchors per position: sizes 8, 16 and 32
times the stride (128, 256, 512 pixels) by aspect ratios 0.5, 1, 2.

**Proposal selection (no NMS).** The ``R`` highest objectness logits of each image are taken with one ``TopK``
(``train_rois`` = 512 in ``train()`` mode, as torchvision's and Detectron's ``batch_size_per_image``;
``test_rois`` = 300 in ``eval()`` mode, tf-faster-rcnn's ``RPN_POST_NMS_TOP_N``). The anchors of the selected
indices are rebuilt from the indices by integer arithmetic (anchor ``a``, column and row), so no anchor table is
stored; their deltas are gathered (``GatherElements``) and decoded (torchvision's ``BoxCoder``: centre shift,
``exp`` of the clamped log-size deltas, corners, clip to the image). The real training pipeline -- pre-NMS top
12000, NMS at IoU 0.7, post-NMS top 2000, then sampling ``R`` RoIs against the ground truth (25 % foreground) -- is
replaced by this single TopK: it feeds the head the same number of RoIs, which is what the head's FLOPs depend on.
NMS and ground-truth matching are omitted from the graph (their bounds are in the benchmark), as are the losses.
Proposals are detached (``.detach()``), as in torchvision: no gradient flows into the box coordinates. ONNX cannot
express ``detach``; in the exported graph the gradient stops at ``GridSample``'s ``grid`` input, which the ONNX
schema marks non-differentiable, so only the few element-wise decoding ops of the ``R`` selected boxes get a
(negligible) backward count; ``TopK`` is listed in ``backward_unsupported`` (its gradient would be a scatter of
``R`` values into distinct positions, 0 FLOPs, and its ``values`` output is unused here).

**RoI pooling (RoIAlign as GridSample).** torchvision's ``roi_align`` is unavailable, so each RoI is sampled
bilinearly on a 14x14 grid (one sample per bin, RoIAlign with ``aligned=True`` coordinates: image coordinate x is
feature coordinate x/16) with ``F.grid_sample``, then max-pooled 2x2 to 7x7 -- tf-faster-rcnn's
``crop_and_resize`` + max pool. The sampling grids of all RoIs of an image are stacked along the grid's height, so
one ``GridSample`` per batch reads the shared feature map ([N, C, R*14, 14] out) and no per-RoI copy of the
feature map is ever made. The grid coordinates are built with broadcasting element-wise ops (AffineGrid would do
the same arithmetic; building it directly keeps the graph at opset 18).

**RoI head.** ``head="c4"`` (default): the res5 stage (3 bottlenecks, width 512, 2048 channels out) on the 7x7
RoI features with stride 1, as tf-faster-rcnn runs it, then a global average pool; ``head="2fc"``: the FPN-less
box head, two fully connected layers of 1024 on the flattened 1024x7x7 RoI features, with ReLU. Then a classifier
(``num_classes`` = 5 logits) and class-specific box regression (4 per class), both linear with bias.

Outputs: ``(class_logits [N*R, K], box_deltas [N*R, 4K], rpn_logits [N, A, H/16, W/16], rpn_deltas
[N, 4A, H/16, W/16])``; the RPN maps are outputs so that the RPN heads, trained by the RPN losses, stay in the graph.
Input height and width should be multiples of 16; then every backbone and RPN count is exactly proportional to
the image area. Feature-map sizes are read as Python ints, so exported graphs hold them as constants (the
TorchScript tracer warns about it): only the batch dimension stays symbolic.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .resnet import EXPANSION, STAGE_WIDTHS, Bottleneck

__all__ = [
    "ANCHOR_RATIOS",
    "ANCHOR_SCALES",
    "FEATURE_STRIDE",
    "IMAGE_SIZE",
    "IN_CHANNELS",
    "NUM_CLASSES",
    "PARTS",
    "RPN",
    "Backbone",
    "C4Head",
    "FasterRCNN",
    "ProposalSelector",
    "RoIPool",
    "TwoFCHead",
    "faster_rcnn_r50",
    "part_of",
]

IN_CHANNELS = 16
IMAGE_SIZE = (768, 1152)
NUM_CLASSES = 5  # four extreme-weather event classes + background
FEATURE_STRIDE = 16
ANCHOR_SCALES = (8, 16, 32)  # times the stride: 128, 256, 512 pixels
ANCHOR_RATIOS = (0.5, 1.0, 2.0)  # height / width
BACKBONE_BLOCKS = (3, 4, 6)  # res2, res3, res4 of ResNet-50
HEAD_BLOCKS = 3  # res5
RPN_CHANNELS = 512
SAMPLES = 14  # bilinear samples per RoI side, max-pooled 2x2 to POOLED
POOLED = 7
FC_DIM = 1024
TRAIN_ROIS = 512
TEST_ROIS = 300
BBOX_CLIP = math.log(1000.0 / 16)  # torchvision's clamp of the log-size deltas


def _static_size(x: torch.Tensor) -> tuple[int, int]:
    """Height and width of ``x`` as Python ints, so that exported graphs hold them as constants: arithmetic on
    traced sizes would leave scalar operations in the graph whose count does not scale with the batch."""
    return int(x.shape[-2]), int(x.shape[-1])


def _stage(in_channels: int, width: int, blocks: int, stride: int) -> nn.Sequential:
    layers = [Bottleneck(in_channels, width, stride)]
    layers += [Bottleneck(width * EXPANSION, width) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


class Backbone(nn.Module):
    """ResNet-50 v1.5 up to res4 (C4): stem 7x7/2 + max pool, then stages of 3, 4 and 6 bottlenecks."""

    out_channels = STAGE_WIDTHS[2] * EXPANSION  # 1024

    def __init__(self, in_channels: int = IN_CHANNELS) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        channels, stages = 64, []
        for index, (blocks, width) in enumerate(zip(BACKBONE_BLOCKS, STAGE_WIDTHS)):
            stages.append(_stage(channels, width, blocks, 1 if index == 0 else 2))
            channels = width * EXPANSION
        self.layer1, self.layer2, self.layer3 = stages

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer3(self.layer2(self.layer1(x)))


class RPN(nn.Module):
    """3x3 conv + ReLU, then 1x1 convs to A objectness logits and 4A box deltas per position."""

    def __init__(self, in_channels: int, channels: int = RPN_CHANNELS, anchors: int = 9) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, kernel_size=3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.cls_logits = nn.Conv2d(channels, anchors, kernel_size=1)
        self.bbox_pred = nn.Conv2d(channels, 4 * anchors, kernel_size=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.relu(self.conv(x))
        return self.cls_logits(t), self.bbox_pred(t)


class ProposalSelector(nn.Module):
    """The ``R`` top-scoring anchors of each image, decoded to clipped boxes ``[N, R, 4]`` (x1, y1, x2, y2).

    ``R`` is ``train_rois`` in training mode and ``test_rois`` in eval mode. No NMS (see the module docstring).
    """

    def __init__(
        self,
        stride: int = FEATURE_STRIDE,
        scales: tuple[float, ...] = ANCHOR_SCALES,
        ratios: tuple[float, ...] = ANCHOR_RATIOS,
        train_rois: int = TRAIN_ROIS,
        test_rois: int = TEST_ROIS,
    ) -> None:
        super().__init__()
        self.stride, self.train_rois, self.test_rois = stride, train_rois, test_rois
        sizes = []
        for scale in scales:
            for ratio in ratios:
                width = scale * stride / math.sqrt(ratio)  # area (scale*stride)^2, height/width = ratio
                sizes.append((width, width * ratio))
        # Plain Python numbers, made into tensors inside forward: a buffer would be a float initializer, which the
        # training count would take for a trainable parameter.
        self.anchor_sizes = tuple(sizes)

    @property
    def num_anchors(self) -> int:
        return len(self.anchor_sizes)

    @property
    def rois(self) -> int:
        return self.train_rois if self.training else self.test_rois

    def forward(self, logits: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
        a = self.num_anchors
        height, width = _static_size(logits)
        # index = (row * W + column) * A + anchor, the order of a [N, H, W, A] layout
        scores = logits.permute(0, 2, 3, 1).flatten(1)  # [N, H*W*A]
        deltas = deltas.unflatten(1, (a, 4)).permute(0, 3, 4, 1, 2).flatten(1, 3)  # [N, H*W*A, 4]
        index = torch.topk(scores, self.rois, dim=1).indices  # [N, R], int64
        picked = torch.gather(deltas, 1, index.unsqueeze(-1).expand(-1, -1, 4))  # [N, R, 4]

        anchor, cell = index % a, index // a
        cx = ((cell % width).to(picked.dtype) + 0.5) * self.stride
        cy = ((cell // width).to(picked.dtype) + 0.5) * self.stride
        sizes = torch.tensor(self.anchor_sizes, dtype=picked.dtype, device=picked.device)  # [A, 2]
        aw, ah = sizes[:, 0][anchor], sizes[:, 1][anchor]

        dx, dy, dw, dh = picked.unbind(-1)
        px, py = cx + dx * aw, cy + dy * ah
        pw = aw * torch.exp(dw.clamp(max=BBOX_CLIP))
        ph = ah * torch.exp(dh.clamp(max=BBOX_CLIP))
        image_w, image_h = float(width * self.stride), float(height * self.stride)
        boxes = torch.stack(
            [
                (px - 0.5 * pw).clamp(0.0, image_w),
                (py - 0.5 * ph).clamp(0.0, image_h),
                (px + 0.5 * pw).clamp(0.0, image_w),
                (py + 0.5 * ph).clamp(0.0, image_h),
            ],
            dim=-1,
        )
        return boxes.detach()  # proposals carry no gradient (torchvision does the same)


class RoIPool(nn.Module):
    """RoIAlign-like pooling by ``grid_sample``: ``samples`` x ``samples`` bilinear samples per RoI, max-pooled 2x2.

    ``features`` [N, C, Hf, Wf] and ``boxes`` [N, R, 4] in image pixels give [N*R, C, samples/2, samples/2].
    """

    def __init__(self, stride: int = FEATURE_STRIDE, samples: int = SAMPLES) -> None:
        super().__init__()
        self.stride, self.samples = stride, samples
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)

    def forward(self, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        p = self.samples
        height, width = _static_size(features)
        # bin centres (j + 1/2)/P of a unit box; grid coordinates in [-1, 1] with align_corners=False, where the
        # feature map spans [0, Wf] and image coordinate x is feature coordinate x/stride
        u = (torch.arange(p, dtype=features.dtype, device=features.device) + 0.5) / p
        x1, y1, x2, y2 = boxes.unbind(-1)  # [N, R]
        gx = (x1.unsqueeze(-1) + (x2 - x1).unsqueeze(-1) * u) * (2.0 / (self.stride * width)) - 1.0  # [N, R, P]
        gy = (y1.unsqueeze(-1) + (y2 - y1).unsqueeze(-1) * u) * (2.0 / (self.stride * height)) - 1.0
        # (x, y) of sample (i, j) is (gx[j], gy[i]): [N, R, P, P, 2]
        grid = torch.stack([gx.unsqueeze(-2).expand(-1, -1, p, -1), gy.unsqueeze(-1).expand(-1, -1, -1, p)], dim=-1)
        grid = grid.flatten(1, 2)  # [N, R*P, P, 2]: every RoI's grid stacked along the grid's height
        sampled = F.grid_sample(features, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        rois = sampled.unflatten(2, (-1, p)).transpose(1, 2).flatten(0, 1)  # [N*R, C, P, P]
        return self.pool(rois)


class C4Head(nn.Module):
    """res5 (3 bottlenecks, stride 1) on the pooled RoIs, global average pool, class and box predictors."""

    def __init__(self, in_channels: int = Backbone.out_channels, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        width = STAGE_WIDTHS[3]
        self.layer4 = _stage(in_channels, width, HEAD_BLOCKS, 1)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.cls_score = nn.Linear(width * EXPANSION, num_classes)
        self.bbox_pred = nn.Linear(width * EXPANSION, 4 * num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.flatten(self.avgpool(self.layer4(x)), 1)
        return self.cls_score(x), self.bbox_pred(x)


class TwoFCHead(nn.Module):
    """Flatten, two fully connected layers of ``fc_dim`` with ReLU, class and box predictors (FPN-less box head)."""

    def __init__(
        self, in_channels: int = Backbone.out_channels, num_classes: int = NUM_CLASSES, fc_dim: int = FC_DIM
    ) -> None:
        super().__init__()
        self.fc6 = nn.Linear(in_channels * POOLED * POOLED, fc_dim)
        self.fc7 = nn.Linear(fc_dim, fc_dim)
        self.relu = nn.ReLU(inplace=True)
        self.cls_score = nn.Linear(fc_dim, num_classes)
        self.bbox_pred = nn.Linear(fc_dim, 4 * num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.relu(self.fc7(self.relu(self.fc6(torch.flatten(x, 1)))))
        return self.cls_score(x), self.bbox_pred(x)


HEADS = {"c4": C4Head, "2fc": TwoFCHead}


class FasterRCNN(nn.Module):
    """Backbone, RPN, proposal selection, RoI pooling and RoI head (see the module docstring)."""

    def __init__(
        self,
        in_channels: int = IN_CHANNELS,
        num_classes: int = NUM_CLASSES,
        head: str = "c4",
        train_rois: int = TRAIN_ROIS,
        test_rois: int = TEST_ROIS,
        rpn_channels: int = RPN_CHANNELS,
    ) -> None:
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {head!r}")
        self.backbone = Backbone(in_channels)
        self.proposals = ProposalSelector(train_rois=train_rois, test_rois=test_rois)
        self.rpn = RPN(self.backbone.out_channels, rpn_channels, self.proposals.num_anchors)
        self.roi_pool = RoIPool()
        self.head = HEADS[head](self.backbone.out_channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.backbone(images)
        rpn_logits, rpn_deltas = self.rpn(features)
        boxes = self.proposals(rpn_logits, rpn_deltas)
        class_logits, box_deltas = self.head(self.roi_pool(features, boxes))
        return class_logits, box_deltas, rpn_logits, rpn_deltas


#: The top-level submodules of :class:`FasterRCNN`, in the order the forward pass runs them.
PARTS = ("backbone", "rpn", "proposals", "roi_pool", "head")


def part_of(node_name: str) -> str:
    """The part of :data:`PARTS` that an exported node belongs to, from the scope the TorchScript exporter writes
    into node names (``/backbone/layer1/layer1.0/conv1/Conv``); ``"other"`` for nodes outside every part.

    >>> part_of("/head/layer4/layer4.0/conv1/Conv"), part_of("/Constant_3")
    ('head', 'other')
    """
    scope = node_name.lstrip("/").split("/", 1)[0]
    return scope if scope in PARTS and "/" in node_name.lstrip("/") else "other"


def faster_rcnn_r50(
    head: str = "c4", train_rois: int = TRAIN_ROIS, test_rois: int = TEST_ROIS, in_channels: int = IN_CHANNELS
) -> FasterRCNN:
    """The extreme-weather detector: ResNet-50 C4 backbone, RPN with 9 anchors, ``head`` RoI head, random weights.

    Examples
    --------
    >>> model = faster_rcnn_r50(train_rois=8).train()
    >>> [tuple(t.shape) for t in model(torch.zeros(1, 16, 64, 96))]
    [(8, 5), (8, 20), (1, 9, 4, 6), (1, 36, 4, 6)]
    """
    return FasterRCNN(in_channels=in_channels, head=head, train_rois=train_rois, test_rois=test_rois)
