"""The part of TensorFlow Lite's FlatBuffers schema (tensorflow/compiler/mlir/lite/schema/schema.fbs) that
the TFLite frontend reads, as tables for format.flatbuf's checked decoder: field slots, types and
defaults as the schema gives them. Option tables of ops the frontend does not convert are left out (their
union member decodes to nothing)."""
from __future__ import annotations

from ...format.flatbuf import Schema

# BuiltinOperator, in enum order (value = position)
BUILTIN_OPS = """
    ADD AVERAGE_POOL_2D CONCATENATION CONV_2D DEPTHWISE_CONV_2D DEPTH_TO_SPACE
    DEQUANTIZE EMBEDDING_LOOKUP FLOOR FULLY_CONNECTED HASHTABLE_LOOKUP L2_NORMALIZATION
    L2_POOL_2D LOCAL_RESPONSE_NORMALIZATION LOGISTIC LSH_PROJECTION LSTM MAX_POOL_2D
    MUL RELU RELU_N1_TO_1 RELU6 RESHAPE RESIZE_BILINEAR
    RNN SOFTMAX SPACE_TO_DEPTH SVDF TANH CONCAT_EMBEDDINGS
    SKIP_GRAM CALL CUSTOM EMBEDDING_LOOKUP_SPARSE PAD UNIDIRECTIONAL_SEQUENCE_RNN
    GATHER BATCH_TO_SPACE_ND SPACE_TO_BATCH_ND TRANSPOSE MEAN SUB
    DIV SQUEEZE UNIDIRECTIONAL_SEQUENCE_LSTM STRIDED_SLICE BIDIRECTIONAL_SEQUENCE_RNN EXP
    TOPK_V2 SPLIT LOG_SOFTMAX DELEGATE BIDIRECTIONAL_SEQUENCE_LSTM CAST
    PRELU MAXIMUM ARG_MAX MINIMUM LESS NEG
    PADV2 GREATER GREATER_EQUAL LESS_EQUAL SELECT SLICE
    SIN TRANSPOSE_CONV SPARSE_TO_DENSE TILE EXPAND_DIMS EQUAL
    NOT_EQUAL LOG SUM SQRT RSQRT SHAPE
    POW ARG_MIN FAKE_QUANT REDUCE_PROD REDUCE_MAX PACK
    LOGICAL_OR ONE_HOT LOGICAL_AND LOGICAL_NOT UNPACK REDUCE_MIN
    FLOOR_DIV REDUCE_ANY SQUARE ZEROS_LIKE FILL FLOOR_MOD
    RANGE RESIZE_NEAREST_NEIGHBOR LEAKY_RELU SQUARED_DIFFERENCE MIRROR_PAD ABS
    SPLIT_V UNIQUE CEIL REVERSE_V2 ADD_N GATHER_ND
    COS WHERE RANK ELU REVERSE_SEQUENCE MATRIX_DIAG
    QUANTIZE MATRIX_SET_DIAG ROUND HARD_SWISH IF WHILE
    NON_MAX_SUPPRESSION_V4 NON_MAX_SUPPRESSION_V5 SCATTER_ND SELECT_V2 DENSIFY SEGMENT_SUM
    BATCH_MATMUL PLACEHOLDER_FOR_GREATER_OP_CODES CUMSUM CALL_ONCE BROADCAST_TO RFFT2D
    CONV_3D IMAG REAL COMPLEX_ABS HASHTABLE HASHTABLE_FIND
    HASHTABLE_IMPORT HASHTABLE_SIZE REDUCE_ALL CONV_3D_TRANSPOSE VAR_HANDLE READ_VARIABLE
    ASSIGN_VARIABLE BROADCAST_ARGS RANDOM_STANDARD_NORMAL BUCKETIZE RANDOM_UNIFORM MULTINOMIAL
    GELU DYNAMIC_UPDATE_SLICE RELU_0_TO_1
""".split()

# the BuiltinOptions union's members, in tag order from 1
OPTION_TABLES = """
    Conv2DOptions DepthwiseConv2DOptions ConcatEmbeddingsOptions LSHProjectionOptions
    Pool2DOptions SVDFOptions RNNOptions FullyConnectedOptions
    SoftmaxOptions ConcatenationOptions AddOptions L2NormOptions
    LocalResponseNormalizationOptions LSTMOptions ResizeBilinearOptions CallOptions
    ReshapeOptions SkipGramOptions SpaceToDepthOptions EmbeddingLookupSparseOptions
    MulOptions PadOptions GatherOptions BatchToSpaceNDOptions
    SpaceToBatchNDOptions TransposeOptions ReducerOptions SubOptions
    DivOptions SqueezeOptions SequenceRNNOptions StridedSliceOptions
    ExpOptions TopKV2Options SplitOptions LogSoftmaxOptions
    CastOptions DequantizeOptions MaximumMinimumOptions ArgMaxOptions
    LessOptions NegOptions PadV2Options GreaterOptions
    GreaterEqualOptions LessEqualOptions SelectOptions SliceOptions
    TransposeConvOptions SparseToDenseOptions TileOptions ExpandDimsOptions
    EqualOptions NotEqualOptions ShapeOptions PowOptions
    ArgMinOptions FakeQuantOptions PackOptions LogicalOrOptions
    OneHotOptions LogicalAndOptions LogicalNotOptions UnpackOptions
    FloorDivOptions SquareOptions ZerosLikeOptions FillOptions
    BidirectionalSequenceLSTMOptions BidirectionalSequenceRNNOptions UnidirectionalSequenceLSTMOptions FloorModOptions
    RangeOptions ResizeNearestNeighborOptions LeakyReluOptions SquaredDifferenceOptions
    MirrorPadOptions AbsOptions SplitVOptions UniqueOptions
    ReverseV2Options AddNOptions GatherNdOptions CosOptions
    WhereOptions RankOptions ReverseSequenceOptions MatrixDiagOptions
    QuantizeOptions MatrixSetDiagOptions HardSwishOptions IfOptions
    WhileOptions DepthToSpaceOptions NonMaxSuppressionV4Options NonMaxSuppressionV5Options
    ScatterNdOptions SelectV2Options DensifyOptions SegmentSumOptions
    BatchMatMulOptions CumsumOptions CallOnceOptions BroadcastToOptions
    Rfft2dOptions Conv3DOptions HashtableOptions HashtableFindOptions
    HashtableImportOptions HashtableSizeOptions VarHandleOptions ReadVariableOptions
    AssignVariableOptions RandomOptions BucketizeOptions GeluOptions
""".split()

A = "byte"      # ActivationFunctionType: NONE RELU RELU_N1_TO_1 RELU6 TANH SIGN_BIT
P = "byte"      # Padding: SAME VALID

TABLES = {
    "Model": [(0, "version", "uint", ""), (1, "operator_codes", "[OperatorCode]", ""),
              (2, "subgraphs", "[SubGraph]", ""), (3, "description", "string", ""), (4, "buffers", "[Buffer]", "")],
    "OperatorCode": [(0, "deprecated_builtin_code", "byte", "0"), (1, "custom_code", "string", ""),
                     (2, "version", "int", "1"), (3, "builtin_code", "int", "0")],
    "SubGraph": [(0, "tensors", "[Tensor]", ""), (1, "inputs", "[int]", ""), (2, "outputs", "[int]", ""),
                 (3, "operators", "[Operator]", ""), (4, "name", "string", "")],
    "Tensor": [(0, "shape", "[int]", ""), (1, "type", "byte", "0"), (2, "buffer", "uint", "0"), (3, "name", "string", ""),
               (4, "quantization", "QuantizationParameters", ""), (5, "is_variable", "bool", "false"),
               (7, "shape_signature", "[int]", "")],
    "QuantizationParameters": [(0, "min", "[float]", ""), (1, "max", "[float]", ""), (2, "scale", "[float]", ""),
                               (3, "zero_point", "[long]", ""), (6, "quantized_dimension", "int", "0")],
    "Operator": [(0, "opcode_index", "uint", "0"), (1, "inputs", "[int]", ""), (2, "outputs", "[int]", ""),
                 (3, "builtin_options_type", "ubyte (tag of BuiltinOptions)", ""),
                 (4, "builtin_options", "BuiltinOptions", ""), (8, "intermediates", "[int]", "")],
    "Buffer": [(0, "data", "[ubyte]", ""), (1, "offset", "ulong", "0"), (2, "size", "ulong", "0")],
    "Conv2DOptions": [(0, "padding", P, "0"), (1, "stride_w", "int", "0"), (2, "stride_h", "int", "0"),
                      (3, "fused_activation_function", A, "0"), (4, "dilation_w_factor", "int", "1"),
                      (5, "dilation_h_factor", "int", "1")],
    "DepthwiseConv2DOptions": [(0, "padding", P, "0"), (1, "stride_w", "int", "0"), (2, "stride_h", "int", "0"),
                               (3, "depth_multiplier", "int", "0"), (4, "fused_activation_function", A, "0"),
                               (5, "dilation_w_factor", "int", "1"), (6, "dilation_h_factor", "int", "1")],
    "TransposeConvOptions": [(0, "padding", P, "0"), (1, "stride_w", "int", "0"), (2, "stride_h", "int", "0"),
                             (3, "fused_activation_function", A, "0")],
    "Pool2DOptions": [(0, "padding", P, "0"), (1, "stride_w", "int", "0"), (2, "stride_h", "int", "0"),
                      (3, "filter_width", "int", "0"), (4, "filter_height", "int", "0"),
                      (5, "fused_activation_function", A, "0")],
    "FullyConnectedOptions": [(0, "fused_activation_function", A, "0"), (1, "weights_format", "byte", "0"),
                              (2, "keep_num_dims", "bool", "false")],
    "AddOptions": [(0, "fused_activation_function", A, "0")],
    "SubOptions": [(0, "fused_activation_function", A, "0")],
    "MulOptions": [(0, "fused_activation_function", A, "0")],
    "DivOptions": [(0, "fused_activation_function", A, "0")],
    "ConcatenationOptions": [(0, "axis", "int", "0"), (1, "fused_activation_function", A, "0")],
    "ReshapeOptions": [(0, "new_shape", "[int]", "")],
    "SoftmaxOptions": [(0, "beta", "float", "0")],
    "ResizeBilinearOptions": [(2, "align_corners", "bool", "false"), (3, "half_pixel_centers", "bool", "false")],
    "ResizeNearestNeighborOptions": [(0, "align_corners", "bool", "false"), (1, "half_pixel_centers", "bool", "false")],
    "ReducerOptions": [(0, "keep_dims", "bool", "false")],
    "StridedSliceOptions": [(0, "begin_mask", "int", "0"), (1, "end_mask", "int", "0"), (2, "ellipsis_mask", "int", "0"),
                            (3, "new_axis_mask", "int", "0"), (4, "shrink_axis_mask", "int", "0"),
                            (5, "offset", "bool", "false")],
    "SqueezeOptions": [(0, "squeeze_dims", "[int]", "")],
    "GatherOptions": [(0, "axis", "int", "0"), (1, "batch_dims", "int", "0")],
    "PackOptions": [(0, "values_count", "int", "0"), (1, "axis", "int", "0")],
    "UnpackOptions": [(0, "num", "int", "0"), (1, "axis", "int", "0")],
    "SplitOptions": [(0, "num_splits", "int", "0")],
    "SplitVOptions": [(0, "num_splits", "int", "0")],
    "LeakyReluOptions": [(0, "alpha", "float", "0")],
    "MirrorPadOptions": [(0, "mode", "byte", "0")],
    "ArgMaxOptions": [(0, "output_type", "byte", "0")],
    "ArgMinOptions": [(0, "output_type", "byte", "0")],
    "CastOptions": [(0, "in_data_type", "byte", "0"), (1, "out_data_type", "byte", "0")],
    "ShapeOptions": [(0, "out_type", "byte", "0")],
    "UnidirectionalSequenceLSTMOptions": [(0, "fused_activation_function", A, "0"), (1, "cell_clip", "float", "0"),
                                          (2, "proj_clip", "float", "0"), (3, "time_major", "bool", "false")],
    "BatchMatMulOptions": [(0, "adj_x", "bool", "false"), (1, "adj_y", "bool", "false")],
    "L2NormOptions": [(0, "fused_activation_function", A, "0")],
    "LocalResponseNormalizationOptions": [(0, "radius", "int", "0"), (1, "bias", "float", "0"),
                                          (2, "alpha", "float", "0"), (3, "beta", "float", "0")],
    "SpaceToDepthOptions": [(0, "block_size", "int", "0")],
    "DepthToSpaceOptions": [(0, "block_size", "int", "0")],
    "GeluOptions": [(0, "approximate", "bool", "false")],
    "OneHotOptions": [(0, "axis", "int", "0")],
    "CumsumOptions": [(0, "exclusive", "bool", "false"), (1, "reverse", "bool", "false")],
    "WhileOptions": [(0, "cond_subgraph_index", "int", "0"), (1, "body_subgraph_index", "int", "0")],
    "IfOptions": [(0, "then_subgraph_index", "int", "0"), (1, "else_subgraph_index", "int", "0")],
}

SCHEMA = Schema(TABLES, {}, {"BuiltinOptions": {name: k + 1 for k, name in enumerate(OPTION_TABLES)}})

TENSOR_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "string", 6: "bool", 7: "int16",
                9: "int8", 10: "float64", 12: "uint64", 15: "uint32", 16: "uint16"}
ACTIVATIONS = {0: None, 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
