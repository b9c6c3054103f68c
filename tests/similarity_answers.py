"""Material for tests/test_similarity.py: answers written independently of the instructor's
solution and of lib_dist (other algorithms where the lab allows one, other code where it does
not), and the disguises a student copying an answer would use: variables renamed, top-level
functions reordered, comments added.

The independent answers are bodies for the release's `# YOUR CODE HERE` placeholders, in
order, so that a notebook holding them keeps the release's skeleton as a student's would."""

from __future__ import annotations

import ast
import builtins
import keyword
import re
import textwrap

import nbformat
from nbformat.notebooknode import NotebookNode

PLACEHOLDER = re.compile(r"^([ \t]*)# YOUR CODE HERE\n[ \t]*raise NotImplementedError\(\)[ \t]*$",
                         re.MULTILINE)

INDEPENDENT: dict[str, dict[str, list[str]]] = {
    "lab01_cross_entropy": {
        "q1-solution": ['''
            peak = torch.max(logits, dim, keepdim=True)[0]
            centred = logits - peak   # exact: every exponent below is at most 0
            return centred - torch.log(torch.sum(torch.exp(centred), dim, keepdim=True))'''],
        "q2-solution": ['''
            valid = target.ne(ignore_index)
            rows = valid.nonzero().squeeze(1)
            classes = target[rows]
            logp = log_softmax(logits, dim=1)
            total = -logp[rows, classes].sum()
            ctx.save_for_backward(logp, rows, classes)
            ctx.reduction, ctx.count = reduction, rows.numel()
            if reduction == "sum":
                return total
            return total / rows.numel()''', '''
            logp, rows, classes = ctx.saved_tensors
            probs = logp[rows].exp()
            probs[torch.arange(rows.numel()), classes] -= 1.0
            grad_logits = torch.zeros_like(logp)
            grad_logits[rows] = probs
            if ctx.reduction == "mean":
                grad_logits /= max(ctx.count, 1)
            return grad_logits * grad_output, None, None, None'''],
        "q3-solution": ['''
            log_p = torch.nn.functional.logsigmoid(logit)       # log sigmoid(z), stable
            log_not_p = torch.nn.functional.logsigmoid(-logit)  # log(1 - sigmoid(z))
            per_item = -(target * log_p + (1 - target) * log_not_p)
            if reduction == "sum":
                return per_item.sum()
            return per_item.mean()'''],
    },
    "lab02_training": {
        "q1-solution": ['''
            lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
            direction = grad + wd * p if wd else grad
            if mom:
                buf = state.get("momentum_buffer")
                buf = direction.clone() if buf is None else buf * mom + direction
                state["momentum_buffer"] = buf
                direction = buf
            p.sub_(lr * direction)'''],
        "q2-solution": ['''
            b1, b2 = group["betas"]
            if "moments" not in state:
                state["moments"] = (torch.zeros_like(p), torch.zeros_like(p))
            first, second = state["moments"]
            first.lerp_(grad, 1 - b1)
            second.lerp_(grad * grad, 1 - b2)
            k = state["step"]
            p.mul_(1 - group["lr"] * group["weight_decay"])
            denom = (second / (1 - b2 ** k)).sqrt() + group["eps"]
            p.sub_(group["lr"] / (1 - b1 ** k) * first / denom)'''],
        "q3-solution": ['''
            optimizer.zero_grad()
            counted = int((y != ignore_index).sum())
            running = 0.0
            for xb, yb in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
                weight = int((yb != ignore_index).sum()) / max(counted, 1)
                if weight:
                    part = weight * loss_fn(model(xb), yb)
                    part.backward()
                    running += float(part.detach())
            optimizer.step()
            return running'''],
    },
    "lab03_collectives": {
        "q1-solution": ['''
            size = comm.world_size
            me = (comm.rank - root) % size   # counted from the root: the root is 0
            bit = 1
            if me:
                top = 1 << (me.bit_length() - 1)
                comm.recv(tensor, (me - top + root) % size)
                bit = top << 1
            while bit < size:               # then pass it on, farthest child last
                if me + bit < size:
                    comm.send(tensor, (me + bit + root) % size)
                bit <<= 1
            return tensor'''],
        "q2-solution": ['''
            size, me = comm.world_size, comm.rank
            result = [None] * size
            result[me] = tensor.clone()
            carry, origin = result[me], me
            for _ in range(size - 1):
                incoming = torch.empty_like(tensor)
                request = comm.irecv(incoming, (me - 1) % size)
                comm.send(carry, (me + 1) % size)
                request.wait()
                origin = (origin - 1) % size
                result[origin] = carry = incoming
            return result'''],
        "q3-solution": ['''
            size, me = comm.world_size, comm.rank
            data = tensor.flatten().clone()
            spans = chunk_bounds(data.numel(), size)

            def piece(i):
                lo, hi = spans[i % size]
                return data[lo:hi]

            for s in range(1, size):
                buf = torch.empty_like(piece(me - s - 1))
                pending = comm.irecv(buf, (me - 1) % size)
                comm.send(piece(me - s), (me + 1) % size)
                pending.wait()
                piece(me - s - 1).add_(buf)
            result = piece(me).clone()
            return result / size if op == "avg" else result'''],
        "q4-solution": ['''
            size, me = comm.world_size, comm.rank
            view = tensor.view(-1)
            pieces = [view[a:b] for a, b in chunk_bounds(view.numel(), size)]
            nxt, prv = (me + 1) % size, (me - 1) % size
            idx = me
            for _ in range(size - 1):      # phase one: partial sums travel right
                outgoing = pieces[idx]
                idx = (idx - 1) % size
                tmp = torch.empty_like(pieces[idx])
                sent = comm.isend(outgoing, nxt)
                comm.recv(tmp, prv)
                sent.wait()
                pieces[idx].add_(tmp)
            for _ in range(size - 1):      # phase two: finished pieces travel right
                sent = comm.isend(pieces[idx], nxt)
                idx = (idx - 1) % size
                comm.recv(pieces[idx], prv)
                sent.wait()
            if op == "avg":
                tensor.div_(size)
            return tensor'''],
    },
}


def fill(source: str, bodies: list[str]) -> str:
    """The release's cell `source` with its placeholders replaced by `bodies`, in order."""
    bodies = [textwrap.dedent(b).strip("\n") for b in bodies]
    found = PLACEHOLDER.findall(source)
    assert len(found) == len(bodies), f"{len(found)} placeholders, {len(bodies)} bodies"
    queue = iter(bodies)
    return PLACEHOLDER.sub(lambda m: textwrap.indent(next(queue), m.group(1)), source)


def independent(release: NotebookNode, lab: str) -> NotebookNode:
    """The release with every answer cell filled with `INDEPENDENT[lab]`."""
    nb = nbformat.from_dict(release)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in INDEPENDENT[lab]:
            cell.source = fill(cell.source, INDEPENDENT[lab][grade_id])
    return nb


# -- disguises ----------------------------------------------------------------------------

KEEP = set(dir(builtins)) | set(keyword.kwlist) | {"self", "cls", "ctx"}


class _Renamer(ast.NodeTransformer):
    """Renames what a function binds (its local variables and loop targets; not its arguments,
    which a caller may name), so that the code still runs."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _new(self, name: str) -> str:
        if name in KEEP or name.startswith("__"):
            return name
        return self.names.setdefault(name, f"{name[0]}{len(self.names)}_{name[::-1]}")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        outer = dict(self.names)
        args = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store) and sub.id not in args:
                self._new(sub.id)
        self.generic_visit(node)
        self.names = outer
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.names.get(node.id, node.id)
        return node


def renamed(code: str) -> str:
    """`code` with each function's local names renamed consistently (ast.unparse: the layout
    changes too, the comments go)."""
    return ast.unparse(_Renamer().visit(ast.parse(code))) + "\n"


def reordered(code: str) -> str:
    """`code` with its top-level functions and classes in reverse order (the other statements,
    imports and assignments, first, as they were)."""
    tree = ast.parse(code)
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    rest = [n for n in tree.body if n not in defs]
    lines = code.splitlines(keepends=True)

    def text(n: ast.stmt) -> str:
        start = min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])])
        return "".join(lines[start - 1:n.end_lineno])

    return "\n\n".join(text(n).rstrip("\n") for n in rest + defs[::-1]) + "\n"


def commented(code: str, every: int = 3) -> str:
    """`code` with a comment line above every `every`-th line of code."""
    out = []
    for i, line in enumerate(code.splitlines()):
        if i % every == 1 and line.strip():
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}# step {i}: see the lecture notes on this part")
        out.append(line)
    return "\n".join(out) + "\n"


def disguised(code: str) -> str:
    """All three disguises together."""
    return commented(reordered(renamed(code)))
