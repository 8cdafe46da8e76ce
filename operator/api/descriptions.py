"""Field descriptions for the model-config part of the InferenceModel CRD.

Keyed by the proto field (``Message.field``, nested messages dotted) so the CRD generator can put a
description on every field it derives from ``model_config.proto``; a missing key fails generation.
"""

from kubeinfer.server.config.version_policy import DEFAULT_NUM_VERSIONS

CONFIG_FIELDS: dict[str, str] = {
    # ModelConfig (top level)
    "ModelConfig.platform": (
        "Triton platform of the model: onnxruntime_onnx, tensorrt_plan, pytorch_libtorch, tensorflow_savedmodel, "
        "tensorflow_graphdef or ensemble. Give platform or backend; the InferenceServer must provide the matching "
        "backend (spec.backends)."
    ),
    "ModelConfig.backend": (
        "Backend that runs the model (onnxruntime, tensorrt, pytorch, tensorflow, python); implied by platform."
    ),
    "ModelConfig.version_policy": (
        "Which of the versions in spec.versions the server serves: latest (default, the newest "
        f"{DEFAULT_NUM_VERSIONS}), all, or specific."
    ),
    "ModelConfig.max_batch_size": (
        "Largest batch the model accepts. 0 = the model does not batch and dims are the full shape; "
        "> 0 = an implicit leading batch dimension that dims must NOT include."
    ),
    "ModelConfig.input": "Input tensors (config field 'input').",
    "ModelConfig.output": "Output tensors (config field 'output').",
    "ModelConfig.optimization": "Optimization: graph level, CUDA graphs, execution accelerators (e.g. TensorRT).",
    "ModelConfig.dynamic_batching": "Enables the dynamic batcher: requests are combined into batches on the server.",
    "ModelConfig.ensemble_scheduling": "Steps of an ensemble (platform: ensemble); each step calls another model.",
    "ModelConfig.instance_group": "Execution instances of the model: how many, and on which kind of device.",
    "ModelConfig.default_model_filename": (
        "File name of the model inside each version folder; default model.onnx, model.plan, model.pt, "
        "model.savedmodel (a folder) or model.py by platform/backend."
    ),
    "ModelConfig.parameters": "Backend parameters (e.g. intra_op_thread_count), each as {stringValue: ...}.",
    "ModelConfig.model_warmup": "Warmup requests the server runs before marking the model ready.",
    # version policy
    "ModelVersionPolicy.latest": "Serve the newest numVersions versions.",
    "ModelVersionPolicy.Latest.num_versions": "How many of the newest versions to serve.",
    "ModelVersionPolicy.all": "Serve every version in spec.versions.",
    "ModelVersionPolicy.specific": "Serve exactly the listed versions.",
    "ModelVersionPolicy.Specific.versions": "Version numbers to serve; each must appear in spec.versions.",
    # inputs / outputs
    "ModelInput.name": "Tensor name as the model file names it.",
    "ModelInput.data_type": "Element type, as KServe v2 names it (FP32, INT64, BYTES, ...).",
    "ModelInput.format": "Image layout hint for the input (FORMAT_NONE, FORMAT_NHWC, FORMAT_NCHW).",
    "ModelInput.dims": ("Shape without the batch dimension when maxBatchSize > 0; -1 marks a variable-size dimension."),
    "ModelInput.reshape": "Shape the server hands to the model instead of dims (same element count).",
    "ModelTensorReshape.shape": "Target shape; -1 marks a variable-size dimension.",
    "ModelInput.is_shape_tensor": "The input is a TensorRT shape tensor.",
    "ModelInput.allow_ragged_batch": "Requests may differ in this input's shape within one batch.",
    "ModelInput.optional": "The input may be omitted from a request.",
    "ModelInput.is_non_linear_format_io": "The TensorRT input uses a non-linear memory format.",
    "ModelOutput.name": "Tensor name as the model file names it.",
    "ModelOutput.data_type": "Element type, as KServe v2 names it (FP32, INT64, BYTES, ...).",
    "ModelOutput.dims": "Shape without the batch dimension when maxBatchSize > 0; -1 marks a variable size.",
    "ModelOutput.reshape": "Shape the model produces, reshaped by the server to dims.",
    "ModelOutput.label_filename": "File in the model folder with one class label per line (classification).",
    "ModelOutput.is_shape_tensor": "The output is a TensorRT shape tensor.",
    "ModelOutput.is_non_linear_format_io": "The TensorRT output uses a non-linear memory format.",
    # optimization
    "ModelOptimizationPolicy.graph": "Graph optimization level for backends that support it.",
    "ModelOptimizationPolicy.Graph.level": "Optimization level; backend-specific (-1 = off, 0 = default, 1 = all).",
    "ModelOptimizationPolicy.priority": "Relative scheduling priority of the model (PRIORITY_DEFAULT/MAX/MIN).",
    "ModelOptimizationPolicy.cuda": "CUDA-specific optimizations.",
    "ModelOptimizationPolicy.Cuda.graphs": "Capture CUDA graphs where the backend supports it.",
    "ModelOptimizationPolicy.Cuda.busy_wait_events": "Busy-wait on CUDA events instead of blocking.",
    "ModelOptimizationPolicy.Cuda.graph_spec": "Shapes to capture CUDA graphs for.",
    "ModelOptimizationPolicy.Cuda.GraphSpec.batch_size": "Batch size of this CUDA graph.",
    "ModelOptimizationPolicy.Cuda.GraphSpec.input": "Input name → shape of this CUDA graph.",
    "ModelOptimizationPolicy.Cuda.GraphSpec.Shape.dim": "Dimensions of the shape.",
    "ModelOptimizationPolicy.Cuda.GraphSpec.graph_lower_bound": "Smallest shapes this CUDA graph may serve.",
    "ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound.batch_size": "Smallest batch size served by the graph.",
    "ModelOptimizationPolicy.Cuda.GraphSpec.LowerBound.input": "Input name → smallest shape served by the graph.",
    "ModelOptimizationPolicy.Cuda.output_copy_stream": "Copy outputs on a separate CUDA stream.",
    "ModelOptimizationPolicy.execution_accelerators": "Execution providers, e.g. tensorrt for ONNX models on GPU.",
    "ModelOptimizationPolicy.ExecutionAccelerators.gpu_execution_accelerator": (
        "GPU accelerators in order of preference (e.g. {name: tensorrt, parameters: {precision_mode: FP16}})."
    ),
    "ModelOptimizationPolicy.ExecutionAccelerators.Accelerator.name": "Accelerator name (tensorrt, cuda, openvino).",
    "ModelOptimizationPolicy.ExecutionAccelerators.Accelerator.parameters": (
        "Accelerator options, e.g. precision_mode, max_workspace_size_bytes, trt_engine_cache_enable."
    ),
    "ModelOptimizationPolicy.ExecutionAccelerators.cpu_execution_accelerator": "CPU accelerators, in order.",
    "ModelOptimizationPolicy.input_pinned_memory": "Use pinned host memory for inputs.",
    "ModelOptimizationPolicy.PinnedMemoryBuffer.enable": "Enable pinned memory.",
    "ModelOptimizationPolicy.output_pinned_memory": "Use pinned host memory for outputs.",
    "ModelOptimizationPolicy.gather_kernel_buffer_threshold": "Gather inputs on GPU above this many buffers.",
    "ModelOptimizationPolicy.eager_batching": "Start a batch before all of its requests have arrived.",
    # dynamic batching
    "ModelDynamicBatching.preferred_batch_size": (
        "Batch sizes the batcher tries to form; each at most maxBatchSize. Usually leave empty."
    ),
    "ModelDynamicBatching.max_queue_delay_microseconds": (
        "How long the oldest request may wait for a fuller batch (microseconds; 0 = dispatch at once)."
    ),
    "ModelDynamicBatching.preserve_ordering": "Return responses in the order requests arrived.",
    "ModelDynamicBatching.priority_levels": "Number of priority levels (1 = highest); 0 disables priorities.",
    "ModelDynamicBatching.default_priority_level": "Priority of requests that give none; within 1..priorityLevels.",
    "ModelDynamicBatching.default_queue_policy": "Queue policy of every priority level without its own.",
    "ModelDynamicBatching.priority_queue_policy": 'Priority level (as a string key, e.g. "1") → its queue policy.',
    "ModelQueuePolicy.timeout_action": "What happens to a request whose timeout expires in the queue: REJECT or DELAY.",
    "ModelQueuePolicy.default_timeout_microseconds": "Queue timeout of requests that give none (0 = none).",
    "ModelQueuePolicy.allow_timeout_override": "A request may set a shorter timeout of its own.",
    "ModelQueuePolicy.max_queue_size": "Most requests queued; more are rejected as unavailable (0 = unbounded).",
    # ensemble
    "ModelEnsembling.step": "Steps of the ensemble, each calling one model.",
    "ModelEnsembling.Step.model_name": "Model this step calls (an InferenceModel on the same server).",
    "ModelEnsembling.Step.model_version": "Version this step calls; -1 = the latest ready version.",
    "ModelEnsembling.Step.input_map": "Step model's input name → ensemble tensor that feeds it.",
    "ModelEnsembling.Step.output_map": "Step model's output name → ensemble tensor it produces (once per tensor).",
    "ModelEnsembling.Step.model_namespace": "Namespace of the step's model when the server uses model namespacing.",
    "ModelEnsembling.max_inflight_requests": "Most requests in flight inside the ensemble (0 = unbounded).",
    # instance groups
    "ModelInstanceGroup.name": "Name of the group; defaults to the model name and an index.",
    "ModelInstanceGroup.kind": "Device kind: KIND_AUTO, KIND_GPU, KIND_CPU or KIND_MODEL.",
    "ModelInstanceGroup.count": "Instances of the model per device (per GPU for KIND_GPU).",
    "ModelInstanceGroup.rate_limiter": "Resources an instance needs before it may execute.",
    "ModelRateLimiter.resources": "Named resources an execution consumes.",
    "ModelRateLimiter.Resource.name": "Resource name.",
    "ModelRateLimiter.Resource.global": "The resource is shared by all devices.",
    "ModelRateLimiter.Resource.count": "Units of the resource one execution needs.",
    "ModelRateLimiter.priority": "Weight of this instance when resources are contended.",
    "ModelInstanceGroup.gpus": "GPU device ids to place instances on (default: every visible GPU).",
    "ModelInstanceGroup.secondary_devices": "Secondary devices (NVDLA) the instances use.",
    "ModelInstanceGroup.SecondaryDevice.kind": "Kind of secondary device.",
    "ModelInstanceGroup.SecondaryDevice.device_id": "Device id of the secondary device.",
    "ModelInstanceGroup.profile": "TensorRT optimization profiles the instances use.",
    "ModelInstanceGroup.passive": "Instances are loaded but receive no requests.",
    "ModelInstanceGroup.host_policy": "Host policy name applied to the instances.",
    "ModelParameter.string_value": "Parameter value, as a string.",
    # warmup
    "ModelWarmup.name": "Name of the warmup sample.",
    "ModelWarmup.batch_size": "Batch size of the warmup request.",
    "ModelWarmup.inputs": "Input name → the data to send.",
    "ModelWarmup.Input.data_type": "Element type, as KServe v2 names it.",
    "ModelWarmup.Input.dims": "Shape of the input without the batch dimension.",
    "ModelWarmup.Input.zero_data": "Send zeros.",
    "ModelWarmup.Input.random_data": "Send random data.",
    "ModelWarmup.Input.input_data_file": "Send the contents of this file (in the model folder's warmup/ folder).",
    "ModelWarmup.count": "How many times to run the warmup request.",
    # response cache
    "ModelConfig.response_cache": (
        "Response cache: identical requests are answered from the server's cache (sized by the server's "
        "--cache-config local,size=N)."
    ),
    "ModelResponseCache.enable": "Cache this model's responses.",
    # custom operations
    "ModelConfig.model_operations": (
        "Custom-op libraries the onnxruntime backend registers before it loads the model (other backends "
        "ignore the field, as Triton does)."
    ),
    "ModelOperations.op_library_filename": (
        "ONNX Runtime custom-op libraries: an absolute path to one outside the model repository (e.g. in the "
        "server image), or a file name in the model's folder."
    ),
    # sequence batching
    "ModelConfig.sequence_batching": (
        "Enables the sequence batcher for stateful models: every request of a sequence (request parameters "
        "sequence_id, sequence_start, sequence_end) goes to the same instance and batch slot, in order."
    ),
    "ModelSequenceBatching.max_sequence_idle_microseconds": (
        "A sequence that sends nothing for this long loses its slot (default 1000000 = 1 s); its next "
        "request is refused until a new sequence_start."
    ),
    "ModelSequenceBatching.control_input": "Model inputs the batcher fills: sequence start, end, ready and id.",
    "ModelSequenceBatching.ControlInput.name": "Name of the model input that receives the control.",
    "ModelSequenceBatching.ControlInput.control": "The control this input carries (exactly one).",
    "ModelSequenceBatching.Control.kind": (
        "CONTROL_SEQUENCE_START, CONTROL_SEQUENCE_END, CONTROL_SEQUENCE_READY or CONTROL_SEQUENCE_CORRID."
    ),
    "ModelSequenceBatching.Control.int32_false_true": "START/END/READY as an INT32 tensor: [false value, true value].",
    "ModelSequenceBatching.Control.fp32_false_true": "START/END/READY as an FP32 tensor: [false value, true value].",
    "ModelSequenceBatching.Control.bool_false_true": "START/END/READY as a BOOL tensor: [false value, true value].",
    "ModelSequenceBatching.Control.data_type": "CORRID tensor type: UINT64, INT64, UINT32, INT32 or BYTES.",
    "ModelSequenceBatching.state": (
        "Implicit state: a model output fed back as an input on the sequence's next request."
    ),
    "ModelSequenceBatching.State.input_name": "Model input that receives the state.",
    "ModelSequenceBatching.State.output_name": "Model output that produces the next state.",
    "ModelSequenceBatching.State.data_type": "Element type of the state.",
    "ModelSequenceBatching.State.dims": "State shape without the batch dimension; -1 = variable.",
    "ModelSequenceBatching.State.initial_state": "The state of a sequence's first request (at most one).",
    "ModelSequenceBatching.State.use_same_buffer_for_input_output": "Accepted for compatibility; no effect here.",
    "ModelSequenceBatching.State.use_growable_memory": "Accepted for compatibility; no effect here.",
    "ModelSequenceBatching.InitialState.data_type": "Element type; must equal the state's.",
    "ModelSequenceBatching.InitialState.dims": "Shape of the initial state (no variable dims).",
    "ModelSequenceBatching.InitialState.zero_data": "Start from zeros.",
    "ModelSequenceBatching.InitialState.data_file": "Start from this file in the model folder's initial_state/ folder.",
    "ModelSequenceBatching.InitialState.name": "Name of the initial state.",
    "ModelSequenceBatching.direct": "Direct strategy: each sequence owns a batch slot (row) of an instance.",
    "ModelSequenceBatching.StrategyDirect.max_queue_delay_microseconds": (
        "How long a batch may wait for more slots to have a request."
    ),
    "ModelSequenceBatching.StrategyDirect.minimum_slot_utilization": (
        "Fraction of slots (0..1) with a request that ends the wait early."
    ),
    "ModelSequenceBatching.oldest": "Oldest strategy: dynamic batches of the oldest requests, one per sequence.",
    "ModelSequenceBatching.StrategyOldest.max_candidate_sequences": "Sequences an instance batches from at once.",
    "ModelSequenceBatching.StrategyOldest.preferred_batch_size": "Batch sizes to prefer.",
    "ModelSequenceBatching.StrategyOldest.max_queue_delay_microseconds": "How long a batch may wait to grow.",
    "ModelSequenceBatching.StrategyOldest.preserve_ordering": (
        "Accepted for compatibility; responses of a sequence are always in order."
    ),
    "ModelSequenceBatching.iterative_sequence": (
        "Iterative sequences (decoupled generation); not supported by this server."
    ),
}
