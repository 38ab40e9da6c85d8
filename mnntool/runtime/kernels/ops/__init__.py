"""The kernels by op: each module registers the factories of its ops (kernels.kernel), and the helpers
only those ops use (conv_strategies, linear, small_attention, mnn_math, small_op_program) sit beside
them. kernels/__init__.py imports the registering modules."""
