"""Partitioned training: each process of a group owns a share of the Gaussians, cut by space, and holds only
those rows' parameters, Adam moments and densification statistics (for models beyond one GPU's memory).

Each row keeps its place in the order one process would hold the whole model (its id), which makes a
partitioned run the run one process makes on the same batches:
- per view, each process projects its own visible Gaussians (reference.project_splats: every row from its own
  values), and the group gathers them in id order; the process that renders the view draws them
  (reference.draw) and sends the projected splats' gradients back, and each process carries them through its
  own projection, view after view as one process does;
- densification decides on the whole model's per-Gaussian figures in id order, draws the split noise as one
  process does, and each process keeps, clones and splits its own rows; the shares are then cut by space again;
- a checkpoint holds the whole model in id order, like a single process's, so it resumes in either mode on any
  number of processes.
What crosses the processes a step is the visible Gaussians' projected splats and their gradients, not the model.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from .distributed import Group
from .formats.compressed_ply import morton_order
from .gaussians import Gaussians
from .render.reference import draw, project_splats
from .strategy import DefaultStrategy, edit_rows


def spatial_owners(means: torch.Tensor, world: int) -> torch.Tensor:
    """Each Gaussian's process: the Gaussians in the Morton order of their means (the compressed PLY's), cut into
    `world` runs of equal count."""
    order = torch.from_numpy(morton_order(means.detach().cpu().numpy())).to(means.device)
    owners = torch.empty(len(means), dtype=torch.long, device=means.device)
    owners[order] = torch.arange(len(means), device=means.device) * world // max(1, len(means))
    return owners


def pack(ids: torch.Tensor, tensors: list[torch.Tensor]) -> torch.Tensor:
    """Rows of ids (int64) and tensors (float32 or int32, of as many rows) as one float32 (n, columns) tensor,
    bit for bit (ints travel as their bits)."""
    columns = [ids.reshape(-1, 1).view(torch.float32)]
    for t in tensors:
        t = t.reshape(len(ids), math.prod(t.shape[1:]))
        columns.append(t.view(torch.float32) if t.dtype == torch.int32 else t)
    return torch.cat(columns, dim=1)


def unpack(packed: torch.Tensor, like: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """pack's ids and tensors, each shaped and typed as its template in `like`."""
    ids = packed[:, :2].contiguous().view(torch.int64).reshape(-1)
    out, col = [], 2
    for t in like:
        width = math.prod(t.shape[1:])
        part = packed[:, col:col + width].contiguous()
        col += width
        out.append((part.view(torch.int32) if t.dtype == torch.int32 else part).reshape((-1,) + t.shape[1:]))
    return ids, out


class Share:
    """The ids of the rows this process owns (in its own order), of the `total` rows of the whole model."""

    def __init__(self, group: Group, ids: torch.Tensor, total: int):
        self.group, self.ids, self.total = group, ids, total

    def gather(self, ids: torch.Tensor, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Every process's rows `ids` of `tensors`, together in id order: the ids and the tensors."""
        rows = torch.cat(self.group.gather(pack(ids, tensors)))
        ids, out = unpack(rows, tensors)
        order = torch.argsort(ids)
        return ids[order], [t[order] for t in out]

    def assemble(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Whole-model tensors in id order, from each process's rows of them (in its own order)."""
        return self.gather(self.ids, tensors)[1]

    def take(self, whole: torch.Tensor) -> torch.Tensor:
        """This process's rows of a whole-model tensor."""
        return whole[self.ids.to(whole.device)]


def take_share(g: Gaussians, group: Group) -> tuple[Share, Gaussians]:
    """This process's share of a whole model (the same on every process), cut by space."""
    ids = (spatial_owners(g.means.detach(), group.world) == group.rank).nonzero().squeeze(1)
    share = Share(group, ids, len(g))
    return share, type(g)(**{name: share.take(t) for name, t in g.tensors().items()})


class PartitionedStrategy(DefaultStrategy):
    """DefaultStrategy over a share: each process's statistics are whole for its rows (no sums across), and
    densification decides on the whole model's figures, exactly as one process does."""

    def __init__(self, config, extent: float, share: Share):
        super().__init__(config, extent)
        self.share = share

    def _gather(self, group: Group) -> None:
        pass

    def state_dict(self, group: Group) -> dict:
        if self.grad_sum is None:
            return {"grad_sum": None, "count": None}
        grad_sum, count = self.share.assemble([self.grad_sum, self.count])
        return {"grad_sum": grad_sum, "count": count}

    def load_state_dict(self, state: dict, device: torch.device, group: Group) -> None:
        def place(t):
            return None if t is None else self.share.take(t.to(device))
        self.grad_sum, self.count = place(state["grad_sum"]), place(state["count"])

    def _densify(self, step: int, g: Gaussians, optimizer, generator) -> None:
        share = self.share
        if self.grad_sum is None:
            return
        clone_all, split_all, prune_all = self._decide(step, *share.assemble(list(self._densify_inputs(g))))
        mine = share.ids.to(clone_all.device)
        clone, split, prune = clone_all[mine], split_all[mine], prune_all[mine]
        # Where each row goes in the whole model's new order: kept rows, then clones, then two children a split.
        kept_at = torch.cumsum(~(prune_all | split_all), 0) - 1
        kept = int(kept_at[-1]) + 1 if len(kept_at) else 0
        clone_at = kept + torch.cumsum(clone_all, 0) - 1
        split_rank = torch.cumsum(split_all, 0) - 1
        children = (2 * split_rank[mine[split]])[:, None] + torch.arange(2, device=mine.device)
        children = children.reshape(-1)
        base = kept + int(clone_all.sum())
        total_children = 2 * int(split_all.sum())

        def normal(shape):  # the samples one process draws for all the children, at this process's children
            return torch.randn((total_children,) + tuple(shape[1:]), generator=generator)[children.cpu()]

        self._apply(g, optimizer, clone, split, prune, normal)
        keep = ~(prune | split)
        share.ids = torch.cat([kept_at[mine[keep]], clone_at[mine[clone]], base + children])
        share.total = base + total_children
        self._rebalance(g, optimizer)

    def _rebalance(self, g: Gaussians, optimizer) -> None:
        """Cut the shares by space again: rows whose owner changed move there, with their Adam moments."""
        share, group = self.share, self.share.group
        owners = share.take(spatial_owners(share.assemble([g.means.detach()])[0], group.world))
        leaving = owners != group.rank
        names = list(g.tensors())
        states = [optimizer.state.get(getattr(g, name), {}) for name in names]
        keys = [key for key in ("exp_avg", "exp_avg_sq") if key in states[0]]
        rows = [getattr(g, name).detach()[leaving] for name in names]
        rows += [state[key][leaving] for state in states for key in keys]
        ids, moved = share.gather(share.ids[leaving], rows + [owners[leaving].to(torch.int32)])
        arriving = moved[-1] == group.rank
        moved = [t[arriving] for t in moved[:-1]]
        append = dict(zip(names, moved[:len(names)]))
        moments = {name: {key: moved[len(names) + i * len(keys) + k] for k, key in enumerate(keys)}
                   for i, name in enumerate(names)} if keys else None
        edit_rows(optimizer, g, keep=~leaving, append=append, moments=moments)
        share.ids = torch.cat([share.ids[~leaving], ids[arriving]])
        self.grad_sum = torch.zeros(len(g), device=g.means.device)
        self.count = torch.zeros(len(g), device=g.means.device)


def row_fields(proj, n: int) -> dict[str, torch.Tensor]:
    """The per-Gaussian tensors of a projection (reference.Projected or RayProjected), a tuple's as name.k."""
    out = {}
    for f in dataclasses.fields(proj):
        value = getattr(proj, f.name)
        if torch.is_tensor(value) and value.dim() and value.shape[0] == n:
            out[f.name] = value
        elif isinstance(value, tuple) and all(torch.is_tensor(v) and v.dim() and v.shape[0] == n for v in value):
            out.update({f"{f.name}.{k}": v for k, v in enumerate(value)})
    return out


def with_fields(proj, fields: dict[str, torch.Tensor]):
    """The projection with its per-Gaussian tensors replaced by `fields` (row_fields' names)."""
    changes = {}
    for f in dataclasses.fields(proj):
        if f.name in fields:
            changes[f.name] = fields[f.name]
        elif f"{f.name}.0" in fields:
            changes[f.name] = tuple(fields[f"{f.name}.{k}"] for k in range(len(getattr(proj, f.name))))
    return dataclasses.replace(proj, **changes)


def trainable(fields: dict[str, torch.Tensor]) -> list[str]:
    """The names of the projected tensors the image's gradient flows back through."""
    return [name for name, t in fields.items() if t.requires_grad]


def train_views(trainer, batch: list[int]):
    """A partitioned step's views: the gradients of this process's rows summed over every view of the batch, in
    the batch's order, and the densification statistics of its rows. Returns (loss, image, target) of the first
    view this process drew, or None."""
    group, share, cfg = trainer.group, trainer.share, trainer.cfg
    projected, drawn = [], {}
    for k, i in enumerate(batch):  # every process projects its share of every view, and the group gathers them
        cam = trainer.data.cameras[i]
        g = trainer.g.at(trainer.data.time(i))
        opacities = g.opacities
        proj = project_splats(g.means, g.quats, torch.exp(g.log_scales), opacities, g.sh, *trainer.views[i],
                              cam.width, cam.height, trainer.sh_degree, cfg.image_formation)
        fields = {**row_fields(proj, len(g)), "opacities.drawn": opacities}
        visible = (proj.radii > 0).nonzero().squeeze(1)
        ids, rows = share.gather(share.ids[visible], [t[visible].detach() for t in fields.values()])
        projected.append((proj, fields, visible, ids))
        if k % group.world == group.rank:
            drawn[k] = dict(zip(fields, rows))
    first = None
    for k, rows in drawn.items():  # the views this process draws, from every process's splats
        i = batch[k]
        cam, gt = trainer.data.cameras[i], trainer.data.images[i]
        for name in trainable(projected[k][1]):
            rows[name].requires_grad_(True)
        proj = with_fields(projected[k][0], rows)
        out = draw(proj, rows["opacities.drawn"], cam.width, cam.height, trainer.background, cfg.image_formation)
        loss, image = trainer.view_loss(out.image, i)
        loss.backward()
        if first is None:
            first = (loss, image, gt)
    for k, (proj, fields, visible, ids) in enumerate(projected):  # the gradients back, view after view
        floats = trainable(fields)
        widths = [math.prod(fields[name].shape[1:]) for name in floats]
        if k in drawn:
            grads = torch.cat([(drawn[k][name].grad if drawn[k][name].grad is not None
                                else torch.zeros_like(drawn[k][name])).reshape(len(ids), width)
                               for name, width in zip(floats, widths)], 1)
        else:
            grads = torch.empty(len(ids), sum(widths), device=trainer.device)
        group.broadcast_(grads, k % group.world)
        mine = grads[torch.searchsorted(ids, share.ids[visible])]
        parts = dict(zip(floats, mine.split(widths, dim=1)))
        proj.means2d.retain_grad()  # its whole gradient, as one process's (the blender formation's goes on)
        torch.autograd.backward([fields[name][visible] for name in floats],
                                [parts[name].reshape(fields[name][visible].shape) for name in floats])
        cam = trainer.data.cameras[batch[k]]
        means2d_grad = proj.means2d.grad if proj.means2d.grad is not None else torch.zeros_like(proj.means2d)
        trainer.strategy.accumulate(trainer.step + 1, means2d_grad, proj.radii, cam.width, cam.height, len(trainer.g))
    return first


def whole_tensors(share: Share, g: Gaussians) -> dict[str, torch.Tensor]:
    """The whole model's parameters by name, in id order, on every process (on the CPU)."""
    return {name: t.cpu() for name, t in zip(g.tensors(), share.assemble([t.detach() for t in g.tensors().values()]))}


def whole_optimizer_state(share: Share, optimizer) -> dict:
    """The whole model's optimizer.state_dict(), its moments in id order, on every process."""
    state = optimizer.state_dict()
    state["state"] = {index: dict(moments) for index, moments in state["state"].items()}  # not the live state
    for moments in state["state"].values():
        keys = [key for key in ("exp_avg", "exp_avg_sq") if key in moments]
        for key, whole in zip(keys, share.assemble([moments[key] for key in keys])):
            moments[key] = whole.cpu()
    return state


def own_optimizer_state(state: dict, share: Share) -> dict:
    """This process's rows of a whole model's optimizer.state_dict()."""
    state = {"state": {i: dict(m) for i, m in state["state"].items()}, "param_groups": state["param_groups"]}
    for moments in state["state"].values():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in moments:
                moments[key] = share.take(moments[key])
    return state
