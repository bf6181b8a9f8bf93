"""The trainer, written once for CPU and GPU: optimise Gaussians against a dataset's views."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.settings import default, stretched_steps
from blender_addon.core.cameras import Camera, intrinsics_from_fov_x, look_at
from .appearance import Appearance, fitted_psnr
from .data.dataset import Dataset, camera_extent, scene_bounds
from .data.images import as_float, quantise
from .distributed import SINGLE, Group
from .dynamic import DynamicGaussians, gaussians_from_tensors
from .gaussians import Gaussians
from .kernels import fallback_note
from .metrics import photometric_loss, psnr, ssim
from .optim import Adam
from .partition import (PartitionedStrategy, own_optimizer_state, take_share, train_views, whole_optimizer_state,
                        whole_tensors)
from .render import camera_tensors, render
from .render.cuda import gradient_step
from .render.formation import STANDARD
from .strategy import DefaultStrategy, DensifyConfig
from . import torch_files

CHECKPOINT_FORMAT = 2


@dataclass
class LearningRates:
    """The standard 3DGS rates, and a 4D model's for its motion (backend.dynamic). The rates of positions
    (means, velocities, accelerations) are scaled by the scene extent and decay exponentially together."""
    means: float = 1.6e-4
    means_final: float = 1.6e-6
    log_scales: float = 5e-3
    quats: float = 1e-3
    opacity_logits: float = 5e-2
    sh_dc: float = 2.5e-3
    sh_rest: float = 2.5e-3 / 20
    velocities: float = 1.6e-3
    accelerations: float = 1.6e-3
    angular_velocities: float = 5e-3
    time_centers: float = 1e-3
    time_precisions: float = 0.2
    colour_transforms: float = 1e-3  # the training views' colour transforms (backend.appearance)


POSITION_RATES = ("means", "velocities", "accelerations")  # scaled by the extent, decaying like the means'


@dataclass
class TrainConfig:
    """A training run's whole configuration. The training settings' defaults are the table's
    (core/settings.py); the schedule's own values (steps, start, densification) are the original 3DGS ones,
    which the presets (policy.py) replace."""
    iterations: int = 30_000
    sh_degree: int = default("sh_degree")
    sh_interval: int = 1000  # the active SH degree grows by one every this many steps
    ssim_weight: float = 0.2
    background: tuple[float, float, float] = tuple(default("background"))
    init_points: int = 100_000  # random initialisation when no points are given
    rasterizer: str = "reference"
    # The image formation the model is trained for (render/formation.py), which it then remembers: its
    # checkpoints hold it, and its PLY says so.
    image_formation: str = default("image_formation")
    seed: int = default("seed")
    log_every: int = 50  # steps between loss read-backs (each is a host synchronisation)
    batch_views: int = 1  # views per step, shared out among a distributed group's processes
    # How a group shares the work (backend/distributed.py): "data", every process holding the whole model, or
    # "partitioned", each holding a share of the Gaussians by space (backend/partition.py).
    parallel: str = "data"
    dynamic: bool = False  # train a 4D model (backend.dynamic) even when the views have no times
    # A colour transform per training view, trained with the model (backend.appearance): the setting
    # `appearance` decides it (policy.make_config).
    colour_transforms: bool = False
    # The schedule stretches to at least this many steps a training view (fit_to_views); 0: as it is.
    min_steps_per_view: int = 0
    lr: LearningRates = field(default_factory=LearningRates)
    densify: DensifyConfig = field(default_factory=DensifyConfig)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        d["lr"] = LearningRates(**d.get("lr", {}))
        d["densify"] = DensifyConfig(**d.get("densify", {}))
        d["background"] = tuple(d.get("background", cls.background))
        return cls(**d)


def fit_to_views(cfg: TrainConfig, n_views: int) -> TrainConfig:
    """The schedule as it runs on n_views training views: where min_steps_per_view asks for more steps than
    cfg.iterations, the steps, the end of densification and the opacity reset period all stretch by the same
    factor (more views hold more to fit than a fixed step count reaches). The result's min_steps_per_view is
    0, so a fitted schedule fits as it is (a resumed run, a bench that fits before the trainer does)."""
    steps = stretched_steps(cfg.iterations, cfg.min_steps_per_view, n_views)
    if steps == cfg.iterations:
        return replace(cfg, min_steps_per_view=0)
    factor = steps / cfg.iterations
    densify = replace(cfg.densify, stop=round(cfg.densify.stop * factor),
                      reset_opacity_every=round(cfg.densify.reset_opacity_every * factor))
    return replace(cfg, iterations=steps, densify=densify, min_steps_per_view=0)


def with_steps(cfg: TrainConfig, steps: int) -> TrainConfig:
    """cfg's schedule run for exactly `steps` steps on any number of views: a chosen count is not stretched."""
    return replace(cfg, iterations=steps, min_steps_per_view=0)


def random_start(data: Dataset, cfg: TrainConfig) -> Gaussians:
    """The Gaussians training starts from when a scene has no points: cfg.init_points at random in the region
    the cameras see (scene_bounds), all of the views' mean colour. Where the views say little (a ceiling
    the cameras only glimpse), what remains of the start is then the scene's average colour, not random ones
    (bench/results/train-init-colour-20261204.md)."""
    center, half = scene_bounds(data.cameras)
    return Gaussians.random_in_box(cfg.init_points, center, half, cfg.sh_degree, cfg.seed, data.mean_color())


def evaluate(g: Gaussians, data: Dataset, sh_degree: int, background, rasterizer: str,
             formation: str = STANDARD) -> dict:
    """mean_scores of our renders in an image formation over a dataset's views, each at its time."""
    return mean_scores((render(g.at(data.time(i)), cam, sh_degree, background, rasterizer, formation=formation).image
                        for i, cam in enumerate(data.cameras)), data.images)


def score(render_view, data: Dataset) -> dict:
    """mean_scores over a dataset's views of render_view(camera) -> (H, W, 3) image."""
    return mean_scores((render_view(cam) for cam in data.cameras), data.images)


def mean_scores(images, targets) -> dict:
    """Mean PSNR and SSIM of (H, W, 3) images (an iterable, drawn without autograd) against targets (a
    dataset's uint8 views, or float ones, each of its image's size), each converted to float in its turn; the
    lowest view PSNR with the view's index, since a mean hides a few bad views (a floater in front of one
    camera); and the mean fitted PSNR (appearance.fitted_psnr: each view's right half after a colour transform
    fitted on its left half), which leaves out a photo's exposure, which no model of the scene can know."""
    psnrs, ssims, fitted = [], [], []
    with torch.no_grad():
        for img, gt in zip(images, targets):
            gt = as_float(gt.to(img.device))
            fitted.append(fitted_psnr(img, gt))
            img = img.clamp(0, 1)
            psnrs.append(psnr(img, gt))
            ssims.append(float(ssim(img, gt)))
    worst = min(range(len(psnrs)), key=psnrs.__getitem__)
    return {"psnr": sum(psnrs) / len(psnrs), "ssim": sum(ssims) / len(ssims), "worst_psnr": psnrs[worst],
            "worst_view": worst, "fitted_psnr": sum(fitted) / len(fitted)}


class Trainer:
    def __init__(self, data: Dataset, cfg: TrainConfig, device: str | torch.device = "cpu",
                 gaussians: Gaussians | None = None, group: Group = SINGLE):
        if cfg.batch_views < group.world:
            raise SplatwrightError(f"{group.world} processes need at least as many views per step, "
                                   f"not {cfg.batch_views}")
        self.note = ""  # what the user is told once about how this training differs from what was asked
        # Views over time are cameras at times, many more than the cameras: their schedule is not stretched.
        over_time = cfg.dynamic or data.times is not None
        cfg = fit_to_views(cfg, 0 if over_time else len(data.cameras))
        self.cfg, self.group = cfg, group
        self.device = torch.device(device)
        if self.device.type == "cuda" and cfg.rasterizer == "reference":
            self.note = "; ".join(filter(None, [fallback_note(), self.note]))
        self.data = data.to(self.device)
        self.views = [camera_tensors(c, self.device) for c in data.cameras]
        self.extent = camera_extent(data.cameras)
        if gaussians is None:
            gaussians = random_start(data, cfg)
        if (cfg.dynamic or data.times is not None) and not isinstance(gaussians, DynamicGaussians):
            gaussians = DynamicGaussians.from_static(gaussians)
        gaussians = gaussians.to(self.device)
        self.share = None  # this process's share of the Gaussians, where the group partitions them
        if cfg.parallel == "partitioned" and group.world > 1:
            self.share, gaussians = take_share(gaussians, group)
            if cfg.rasterizer == "cuda":
                self.note = "; ".join(filter(None, [self.note, "partitioned training draws with the reference "
                                                   "rasterizer's stages (the CUDA kernels project and draw in one)"]))
        elif cfg.parallel not in ("data", "partitioned"):
            raise SplatwrightError(f"parallel {cfg.parallel!r}: choose data or partitioned")
        self.g = gaussians.requires_grad_()
        self.initial_rates = asdict(cfg.lr)
        for name in POSITION_RATES:
            self.initial_rates[name] *= self.extent
        self.optimizer = self._make_optimizer()
        # Every process holds every view's transform (a partitioned group's too) and sums their gradients.
        self.appearance = (Appearance(len(data), cfg.lr.colour_transforms, self.device) if cfg.colour_transforms
                           else None)
        # A static model on the CUDA rasterizer takes its gradients straight from the kernels (bit-equal to
        # autograd's, for a third less host time a step); a 4D model's motion goes through autograd, and so does
        # a view's colour transform (the fused step computes the loss of the render itself).
        self.without_autograd = (cfg.rasterizer == "cuda" and not self.dynamic and self.share is None
                                 and self.appearance is None)
        self.strategy = (DefaultStrategy(cfg.densify, self.extent) if self.share is None
                         else PartitionedStrategy(cfg.densify, self.extent, self.share))
        # On the CPU, so drawing a view or split noise never waits for the GPU.
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.background = torch.tensor(cfg.background, dtype=torch.float32, device=self.device)
        self.step = 0
        self.train_seconds = 0.0
        self.checkpointed_at = 0.0  # train_seconds at the last checkpoint this trainer wrote or was loaded from
        self.last = {"loss": math.nan, "psnr": math.nan}

    def _make_optimizer(self) -> Adam:
        return Adam([{"params": [t], "lr": self.initial_rates[name], "name": name}
                     for name, t in self.g.tensors().items()])

    @property
    def sh_degree(self) -> int:
        return min(self.cfg.sh_degree, self.g.max_sh_degree, self.step // self.cfg.sh_interval)

    def _means_lr(self) -> float:
        t = min(1.0, self.step / max(1, self.cfg.iterations))
        a, b = self.cfg.lr.means * self.extent, self.cfg.lr.means_final * self.extent
        return math.exp(math.log(a) * (1 - t) + math.log(b) * t)

    @property
    def dynamic(self) -> bool:
        """Whether the model is 4D (backend.dynamic)."""
        return isinstance(self.g, DynamicGaussians)

    def train_step(self) -> None:
        start = time.perf_counter()
        means_lr = self._means_lr()
        for group in self.optimizer.param_groups:
            if group["name"] == "means":
                group["lr"] = means_lr
            elif group["name"] in POSITION_RATES:
                group["lr"] = self.initial_rates[group["name"]] * means_lr / self.initial_rates["means"]
        batch = torch.randint(len(self.data), (self.cfg.batch_views,), generator=self.generator).tolist()
        if self.share is not None:
            first = train_views(self, batch)
        for k, i in enumerate(self.group.share(batch) if self.share is None else []):
            cam, gt = self.data.cameras[i], self.data.images[i]  # uint8: the loss converts it
            if self.without_autograd:
                loss, image, means2d_grad, radii = gradient_step(self.g, *self.views[i], cam.width, cam.height,
                                                                 self.sh_degree, self.background, gt,
                                                                 self.cfg.ssim_weight, self.cfg.image_formation)
            else:
                out = render(self.g.at(self.data.time(i)), cam, self.sh_degree, self.background,
                             self.cfg.rasterizer, self.views[i], self.cfg.image_formation)
                loss, image = self.view_loss(out.image, i)
                loss.backward()
                means2d_grad, radii = out.means2d.grad, out.radii
            self.strategy.accumulate(self.step + 1, means2d_grad, radii, cam.width, cam.height, len(self.g))
            if k == 0:
                first = (loss, image, gt)
        self._sum_gradients()
        self.step += 1
        if self.step % self.cfg.log_every == 0 or self.step == self.cfg.iterations:
            loss, image, gt = first
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise FloatingPointError(f"loss became {loss_value} at step {self.step}")
            self.last = {"loss": loss_value, "psnr": psnr(image, gt)}
        self.strategy.refine(self.step, self.g, self.optimizer, self.generator, self.group)
        self.optimizer.step()
        if self.appearance is not None:
            self.appearance.step()
        if self.dynamic:
            self.g.keep_valid_()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda" and self.step % self.cfg.log_every == 0:
            torch.cuda.synchronize(self.device)
        self.train_seconds += time.perf_counter() - start

    def view_loss(self, image: torch.Tensor, view: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The training loss of a render of view `view`, and the image it scores: the render in the view's
        colour transform where training has them."""
        if self.appearance is None:
            return photometric_loss(image, self.data.images[view], self.cfg.ssim_weight), image
        image = self.appearance.apply(image, view)
        loss = photometric_loss(image, self.data.images[view], self.cfg.ssim_weight) + self.appearance.penalty(view)
        return loss, image

    def _sum_gradients(self) -> None:
        """The step's gradient: the mean over its views, of all the group's processes."""
        grads = [t.grad for t in self.g.tensors().values() if t.grad is not None]
        summed = grads if self.share is None else []  # a share's gradients are whole already
        if self.appearance is not None:  # each process's views' rows: the sum holds every view's
            summed = summed + [self.appearance.gradient()]
            grads = grads + [self.appearance.gradient()]
        self.group.sum_(summed)
        if self.cfg.batch_views > 1:
            for grad in grads:
                grad /= self.cfg.batch_views

    def whole_model(self) -> Gaussians:
        """The whole model (a partitioned group's, gathered: every process takes part)."""
        if self.share is None:
            return self.g
        return gaussians_from_tensors(whole_tensors(self.share, self.g)).to(self.device)

    def add_view(self, camera: Camera, image: torch.Tensor, name: str, view_time: float = 0.0) -> None:
        """Append a view (image (H, W, 3) float in [0, 1] at its camera's size, stored quantised like the
        others; seen at `view_time` where the views have times) that later steps draw from too. The scene extent,
        and with it the learning rates, stays that of the views training started with."""
        images = self.data.images + [quantise(image).to(self.device)]
        times = self.data.times + [view_time] if self.data.times is not None else None
        self.data = Dataset(self.data.cameras + [camera], images, self.data.names + [name], times)
        self.views.append(camera_tensors(camera, self.device))
        if self.appearance is not None:
            self.appearance.add_view()

    # Checkpoints hold everything needed to continue exactly: parameters, optimizer moments,
    # densification statistics, step and random state.
    # A partitioned group's checkpoint holds the whole model, as one process's does.
    def state_dict(self) -> dict:
        if self.share is not None:
            gaussians, optimizer = whole_tensors(self.share, self.g), whole_optimizer_state(self.share, self.optimizer)
        else:
            gaussians = {k: v.detach().cpu() for k, v in self.g.tensors().items()}
            optimizer = self.optimizer.state_dict()
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "train_seconds": self.train_seconds,
            "config": asdict(self.cfg),
            "gaussians": gaussians,
            "optimizer": optimizer,
            "strategy": self.strategy.state_dict(self.group),
            "generator": self.generator.get_state(),
            "appearance": None if self.appearance is None else self.appearance.state_dict(),
        }

    @classmethod
    def from_checkpoint(cls, data: Dataset, state: dict, device, cfg: TrainConfig | None = None,
                        group: Group = SINGLE) -> "Trainer":
        """A trainer continuing a checkpoint (load_checkpoint), with the checkpoint's config or `cfg`; in the image
        formation its model was trained in either way, which it remembers, with or without the views' colour
        transforms as it trained, and with its views per step, so that a checkpoint continues alike on any number
        of processes up to its views per step; more processes take one view each, which the trainer says."""
        saved = TrainConfig.from_dict(state["config"])
        asked = cfg or saved
        batch_views = max(saved.batch_views, group.world)
        cfg = replace(cfg or saved, image_formation=saved.image_formation, batch_views=batch_views,
                      colour_transforms=saved.colour_transforms)
        gaussians = gaussians_from_tensors(state["gaussians"])
        trainer = cls(data, cfg, device, gaussians, group)
        if batch_views != saved.batch_views:
            trainer.note = "; ".join(filter(None, [
                f"the checkpoint trained on {saved.batch_views} view(s) a step; on {group.world} processes it goes on "
                f"with {batch_views}, one a process", trainer.note]))
        if asked.image_formation != saved.image_formation:
            trainer.note = "; ".join(filter(None, [
                f"the checkpoint's model was trained in image formation {saved.image_formation!r}, and training "
                f"goes on in it, not in {asked.image_formation!r} (train from scratch to change it)", trainer.note]))
        if asked.colour_transforms != saved.colour_transforms:
            trainer.note = "; ".join(filter(None, [
                f"the checkpoint trained {'with' if saved.colour_transforms else 'without'} per-photo appearance, "
                "and training goes on so (train from scratch to change it)", trainer.note]))
        if trainer.dynamic != isinstance(gaussians, DynamicGaussians):
            raise SplatwrightError("the checkpoint holds a static model, but these views have times (or the "
                                   "configuration says dynamic); train the 4D model from scratch (without --resume)")
        trainer.optimizer.load_state_dict(state["optimizer"] if trainer.share is None
                                          else own_optimizer_state(state["optimizer"], trainer.share))
        trainer.strategy.load_state_dict(state["strategy"], trainer.device, group)
        trainer.generator.set_state(state["generator"])
        if trainer.appearance is not None:
            trainer.appearance.load_state_dict(state["appearance"])
        trainer.step = state["step"]
        trainer.train_seconds = trainer.checkpointed_at = state["train_seconds"]
        return trainer

    def checkpoint_due(self, every_steps: int, every_seconds: float) -> bool:
        """Whether a checkpoint is due after this step: every `every_steps` steps and every `every_seconds`
        of training time since the last one (0 turns either off). In a group only the leader's clock counts:
        the others say False for time, and Group.agree makes it the group's decision."""
        return bool((every_steps and self.step % every_steps == 0)
                    or (self.group.leader and every_seconds
                        and self.train_seconds - self.checkpointed_at >= every_seconds))

    def save_checkpoint(self, path: str | Path) -> None:
        """Durably, keeping the checkpoint it replaces as previous_checkpoint(path) until this one is on the
        disk; any failure to write (a full disk, a read-only folder) raises SplatwrightError naming the file and
        leaves the checkpoints on the disk as they were. In a group every process takes part (the statistics are
        gathered) and the leader alone writes."""
        state = self.state_dict()
        if self.group.leader:
            torch_files.save(path, state, "the checkpoint", previous_checkpoint(path))
        self.checkpointed_at = self.train_seconds


def previous_checkpoint(path: str | Path) -> Path:
    """Where the checkpoint before the newest one is kept (checkpoint.prev.pt beside checkpoint.pt)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def load_latest_checkpoint(path: str | Path) -> tuple[dict, str]:
    """The newest readable checkpoint: `path`, or the previous one when `path` cannot be read (a power
    loss can leave it empty). Returns its state and, after such a fall-back, a warning saying so."""
    try:
        return load_checkpoint(path), ""
    except SplatwrightError as newest:
        previous = previous_checkpoint(path)
        if not previous.is_file():
            raise
        state = load_checkpoint(previous)
        return state, (f"{newest}; continuing from the previous checkpoint {previous.name}, "
                       f"step {state['step']}")


def load_checkpoint(path: str | Path) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises assorted types for truncated or foreign files
        raise SplatwrightError(f"{Path(path).name}: cannot read checkpoint ({e})") from e
    if not isinstance(state, dict) or "format" not in state:
        raise SplatwrightError(f"{Path(path).name}: not a Splatwright checkpoint")
    if state["format"] != CHECKPOINT_FORMAT:
        raise SplatwrightError(f"{Path(path).name}: checkpoint format {state['format']}, but this version reads format "
                               f"{CHECKPOINT_FORMAT}; train again from scratch (without --resume)")
    return state


def warm_up(device: str = "cuda") -> float:
    """A static model's training steps of each kind (SH degrees 0-3, densification, opacity reset, the Gaussian
    cap) on a tiny scene, so that what a process does once before its first training (building or loading the
    CUDA extension, each kernel's first launch, the allocator's first blocks: 4-5 s on an H200 once built, most
    of it the extension's load) is done before a user's training starts. Returns the seconds it took."""
    start = time.perf_counter()
    size = 32
    cameras = [Camera(look_at((3.0 * math.cos(a), 3.0 * math.sin(a), 1.0), (0.0, 0.0, 0.0)),
                      intrinsics_from_fov_x(0.9, size, size), size, size) for a in (0.0, 2.0, 4.0)]
    images = [torch.full((size, size, 3), 128, dtype=torch.uint8) for _ in cameras]
    steps = 4
    on_gpu = torch.device(device).type == "cuda"
    cfg = TrainConfig(iterations=steps, sh_interval=1, init_points=256, log_every=1,
                      rasterizer="cuda" if on_gpu else "reference",
                      densify=DensifyConfig(grad_threshold=0.0, start=0, every=1, stop=steps, reset_opacity_every=2,
                                            max_gaussians=300))
    trainer = Trainer(Dataset(cameras, images, [str(i) for i in range(len(cameras))]), cfg, device)
    while trainer.step < steps:
        trainer.train_step()
    if on_gpu:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
