"""A Horovod training script, as Horovod's PyTorch examples are written, on scikit-learn's
handwritten digits (bundled: nothing is downloaded) instead of MNIST.

    python -m lib_dist.run -np 4 examples/horovod_digits.py --epochs 3
    python examples/horovod_digits.py              # one process: hvd.size() == 1

The only change a Horovod program needs is its import line: `import lib_dist.horovod as hvd`
for `import horovod.torch as hvd`. What makes it data parallel, step by step:
- each rank trains on its own shard of the examples (the sampler);
- the learning rate grows with the number of ranks, since the averaged gradient is that of
  a batch `size()` times larger;
- rank 0's initial parameters and optimizer state are broadcast to every rank (the ranks
  seed differently here on purpose: without the broadcast they would train different models);
- `DistributedOptimizer` averages the gradients over the ranks before every step;
- metrics are averaged over the ranks with a named `allreduce`.
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import lib_dist.horovod as hvd
from lib_dist.data.digits import load_digits
from lib_dist.data_parallel import ShardSampler
from lib_dist.models.mlp import MLP

parser = argparse.ArgumentParser(description="Horovod-style digits classifier")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
parser.add_argument("--test-batch-size", type=int, default=256, help="test batch size per rank")
parser.add_argument("--epochs", type=int, default=3, help="number of epochs to train")
parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one rank")
parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum")
parser.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP")
parser.add_argument("--train-size", type=int, default=0,
                    help="train on the first N training examples (0: all of them)")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--log-interval", type=int, default=10,
                    help="batches between two progress lines")
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                    help="divide gradients by this before the sum, the rest after it")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="train on the CPU even where CUDA is available")
parser.add_argument("--save-dir", default="",
                    help="where each rank saves its final parameters as rank<r>.pt")


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
    total, batches = 0.0, 0
    for batch_idx, (data, target) in enumerate(train_loader):
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        total, batches = total + loss.item(), batches + 1
        if batch_idx % args.log_interval == 0:
            print(f"Train epoch {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]"
                  f"\tloss {loss.item():.6f}")
    train_loss = metric_average(total / max(batches, 1), "avg_train_loss")
    if hvd.rank() == 0:
        print(f"epoch {epoch}: average train loss {train_loss:.6f}")


def metric_average(value, name):
    tensor = torch.tensor(value)
    return hvd.allreduce(tensor, name=name).item()


def test(when):
    model.eval()
    test_loss, correct = 0.0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            output = model(data)
            test_loss += F.cross_entropy(output, target, reduction="sum").item()
            correct += (output.argmax(1) == target).float().sum().item()
    test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
    accuracy = metric_average(correct / len(test_sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(f"Test set {when}: average loss {test_loss:.4f}, accuracy {100 * accuracy:.1f}%")


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    torch.manual_seed(args.seed + hvd.rank())  # different models until the broadcast below
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # one GPU per rank
    torch.set_num_threads(1)  # ranks share the machine's cores

    digits = load_digits(seed=args.seed)
    n = args.train_size or len(digits.y_train)
    train_dataset = TensorDataset(digits.x_train[:n], digits.y_train[:n])
    test_dataset = TensorDataset(digits.x_test, digits.y_test)
    # Each rank takes every size()-th example of one shuffled order (torch's
    # DistributedSampler(num_replicas=hvd.size(), rank=hvd.rank()) gives the same indices).
    train_sampler = ShardSampler(len(train_dataset), hvd.size(), hvd.rank(), seed=args.seed)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = ShardSampler(len(test_dataset), hvd.size(), hvd.rank(), shuffle=False)
    test_loader = DataLoader(test_dataset, batch_size=args.test_batch_size,
                             sampler=test_sampler)

    model = MLP(digits.n_features, [args.hidden], digits.n_classes)
    if args.cuda:
        model.cuda()
    # The averaged gradient is that of a batch size() times larger: scale the rate with it.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)

    # Every rank starts from rank 0's parameters and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression,
        op=hvd.Average, gradient_predivide_factor=args.gradient_predivide_factor)

    test("before training")
    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test(f"after epoch {epoch}")

    if args.save_dir:
        os.makedirs(args.save_dir, exist_ok=True)
        params = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        torch.save(params, os.path.join(args.save_dir, f"rank{hvd.rank()}.pt"))
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"rank {hvd.rank()} of {hvd.size()}: parameter checksum {checksum:.10f}")
