"""The reduce ops, numbered as the engine library's C API numbers them.

Every binding exports them under Horovod's names (`kerasdist.Average`,
`kerasdist.torch.Sum`, ...); they are plain integers, equal everywhere.
"""

Average = 0
Sum = 1
Min = 2
Max = 3
Product = 4
Adasum = 5
OP_NAMES = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max", Product: "Product",
            Adasum: "Adasum"}
