/* flowedge C API: a stable, exception-free C99 surface over the C++ models for other languages and runtimes. */
#ifndef FLOWEDGE_C_API_H
#define FLOWEDGE_C_API_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(FLOWEDGE_C_BUILDING)
#    define FLOWEDGE_C_EXPORT __declspec(dllexport)
#  else
#    define FLOWEDGE_C_EXPORT __declspec(dllimport)
#  endif
#else
#  define FLOWEDGE_C_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Conventions
 * - Every function returning fe_status returns FE_OK (0) on success; on failure it returns another code and
 *   fe_last_error() describes the problem ("flowedge: <component>: <what> (expected X, got Y)").
 * - No C++ exception ever crosses this boundary; every entry point catches everything.
 * - Every buffer comes with its length, in float / int32 elements (bytes for decode state).
 *   Input buffers must hold exactly the elements the call needs: fewer is FE_ERR_INVALID_ARGUMENT (the message
 *   names the argument and the needed size), more is FE_ERR_SHAPE. Output buffers must hold at least the
 *   elements written (fewer is FE_ERR_INVALID_ARGUMENT naming the argument and the size); extra room is untouched.
 * - Layouts are row-major float32. Shapes are written [batch, horizon, action_dim] etc.
 * - An fe_engine may be used from any thread; calls on one engine are serialised by an internal lock.
 */

/** Result codes. The numeric values are stable across releases; new codes are only ever appended. */
typedef enum fe_status {
    FE_OK = 0,                   /**< success */
    FE_ERR_INVALID_ARGUMENT = 1, /**< NULL pointer, undersized buffer, unknown solver/scheduler/device string,
                                      value out of range (steps, batch, timestep, token id) */
    FE_ERR_IO = 2,               /**< the checkpoint path does not exist or cannot be read */
    FE_ERR_FORMAT = 3,           /**< the checkpoint is malformed: bad safetensors header, missing/ill-shaped tensor,
                                      invalid config.json, inconsistent parts */
    FE_ERR_SHAPE = 4,            /**< an input buffer has more elements than the call uses, or a length that is not
                                      a whole number of rows (e.g. noise not a multiple of action_dim) */
    FE_ERR_UNSUPPORTED = 5,      /**< the engine cannot do this: a diffusion call on a mamba-flow engine (or the
                                      reverse), a backbone call on a head-only file, an unsupported scheduler config
                                      or tensor dtype */
    FE_ERR_NON_FINITE = 6,       /**< a NaN/Inf input, or inference produced a non-finite value */
    FE_ERR_DEVICE = 7,           /**< a GPU failure, or FLOWEDGE_CUDA_REQUIRED=1 and the model is not GPU-resident */
    FE_ERR_STATE = 8,            /**< a decode state was rejected by fe_engine_import_state (bad magic, other version,
                                      other model or shape, wrong size, checksum mismatch) */
    FE_ERR_INTERNAL = 9,         /**< an unexpected failure inside flowedge (a bug: please report it) */
    FE_ERR_OUT_OF_MEMORY = 10    /**< a host allocation failed */
} fe_status;

/** What a loaded checkpoint is. */
typedef enum fe_kind {
    FE_KIND_NONE = 0,       /**< returned for a NULL engine */
    FE_KIND_DIFFUSION = 1,  /**< LeRobot Diffusion Policy head (folder, model.safetensors or *.flowedge.safetensors) */
    FE_KIND_MAMBA_FLOW = 2  /**< Mamba backbone and/or flow-matching head (backbone.* / flow.* tensors) */
} fe_kind;

/** A loaded model with all its buffers; opaque. */
typedef struct fe_engine fe_engine;

/** Version of the library, "MAJOR.MINOR.PATCH". Never NULL. */
FLOWEDGE_C_EXPORT const char* fe_version(void);

/** Non-zero when the library was built with the CUDA backend. */
FLOWEDGE_C_EXPORT int fe_built_with_cuda(void);

/** Message of the last failed call on this thread; "" when none. Never NULL. Valid until the next failing call
 *  on the same thread. A successful call does not clear it. */
FLOWEDGE_C_EXPORT const char* fe_last_error(void);

/** Name of a status code ("FE_OK", "FE_ERR_IO", ...); "FE_UNKNOWN" for other values. Never NULL. */
FLOWEDGE_C_EXPORT const char* fe_status_name(fe_status status);

/**
 * Loads a checkpoint, detecting its kind:
 * - a LeRobot pretrained_model folder (config.json + model.safetensors), its model.safetensors, or a compact
 *   *.flowedge.safetensors file (dp.meta tensor) -> FE_KIND_DIFFUSION;
 * - a safetensors file with backbone.* and/or flow.* tensors -> FE_KIND_MAMBA_FLOW (backbone-only and head-only
 *   files are allowed; calls that need the missing part fail with FE_ERR_UNSUPPORTED).
 * device: "cpu", "cuda", "auto" or NULL (= "cpu"). "cuda" uploads weights and scratch once and fails with
 * FE_ERR_DEVICE when that is impossible (no CUDA build, no GPU, not enough memory), as the programs' --device cuda
 * does. "auto" is the fallback-allowed choice: it uploads when it can, otherwise the engine runs on the CPU,
 * fe_engine_cuda_resident() is 0 and fe_engine_fallback_reason() says why (not a load failure).
 * FLOWEDGE_CUDA_REQUIRED=1 turns that fallback into FE_ERR_DEVICE; FLOWEDGE_CUDA_FORCE_HOST=1 skips the upload.
 * Sized for batch 1 and prefixes of up to 512 tokens (see fe_engine_load_ex).
 * On failure *out is set to NULL.
 */
FLOWEDGE_C_EXPORT fe_status fe_engine_load(const char* path, const char* device, fe_engine** out);

/** fe_engine_load with explicit sizes: max_batch (>= 1) bounds the batch of every sample call, max_tokens (>= 1)
 *  the length of one prefix/prefill. All scratch is allocated here; later calls never allocate on the device. */
FLOWEDGE_C_EXPORT fe_status fe_engine_load_ex(const char* path, const char* device, int32_t max_batch,
                                              int32_t max_tokens, fe_engine** out);

/** Frees an engine and everything it holds. NULL is a no-op. */
FLOWEDGE_C_EXPORT void fe_engine_free(fe_engine* engine);

/* ---- introspection: value, 0 when this engine has no such quantity, -1 (and fe_last_error) for NULL ---- */

/** FE_KIND_DIFFUSION / FE_KIND_MAMBA_FLOW (FE_KIND_NONE for NULL). */
FLOWEDGE_C_EXPORT fe_kind fe_engine_kind(const fe_engine* engine);
/** A: action width (diffusion action_dim; flow head action_dim; 0 for a backbone-only file). */
FLOWEDGE_C_EXPORT int32_t fe_engine_action_dim(const fe_engine* engine);
/** H: rows of a diffusion sample (0 for mamba-flow: the flow head returns one action row per sample). */
FLOWEDGE_C_EXPORT int32_t fe_engine_horizon(const fe_engine* engine);
/** Condition width: diffusion global_cond_dim, flow head cond_dim (0 for a backbone-only file). */
FLOWEDGE_C_EXPORT int32_t fe_engine_condition_dim(const fe_engine* engine);
/** Mamba d_model (width of the hidden state of fe_engine_step); 0 for diffusion and head-only files. */
FLOWEDGE_C_EXPORT int32_t fe_engine_d_model(const fe_engine* engine);
/** Mamba vocabulary size (token ids must be in [0, vocab)); 0 without a backbone. */
FLOWEDGE_C_EXPORT int32_t fe_engine_vocab_size(const fe_engine* engine);
/** Diffusion n_obs_steps (0 for mamba-flow). */
FLOWEDGE_C_EXPORT int32_t fe_engine_n_obs_steps(const fe_engine* engine);
/** Diffusion n_action_steps: LeRobot executes rows [n_obs_steps-1, n_obs_steps-1+n_action_steps) (0 for mamba-flow). */
FLOWEDGE_C_EXPORT int32_t fe_engine_n_action_steps(const fe_engine* engine);
/** Diffusion num_train_timesteps T (valid denoise timesteps are [0, T)); 0 for mamba-flow. */
FLOWEDGE_C_EXPORT int32_t fe_engine_num_train_timesteps(const fe_engine* engine);
/** max_batch given at load. */
FLOWEDGE_C_EXPORT int32_t fe_engine_max_batch(const fe_engine* engine);
/** max_tokens given at load (0 without a backbone). */
FLOWEDGE_C_EXPORT int32_t fe_engine_max_tokens(const fe_engine* engine);
/** "cpu" or "cuda": where inference runs ("" for NULL). Never NULL. */
FLOWEDGE_C_EXPORT const char* fe_engine_backend(const fe_engine* engine);
/** 1 when weights and scratch are resident on the GPU, 0 otherwise (also 0 for NULL). */
FLOWEDGE_C_EXPORT int fe_engine_cuda_resident(const fe_engine* engine);
/** Why a device "auto" engine runs on the CPU ("" when it is resident, was loaded for "cpu", or for NULL). Never
 *  NULL; valid until the engine is freed. */
FLOWEDGE_C_EXPORT const char* fe_engine_fallback_reason(const fe_engine* engine);

/* ---- mamba-flow ---- */

/**
 * Mamba + flow policy: prefill(tokens) (decode state reset first), condition = last hidden row, then a flow solve
 * from each noise row. tokens: [n_tokens], 1 <= n_tokens <= max_tokens, ids in [0, vocab);
 * noise: [batch, A] with batch = noise_len / A <= max_batch (every row shares the condition); out: [batch, A].
 * solver: "euler" | "heun" | "rk4" (NULL = "euler"); steps >= 1. Afterwards the decode state holds the prefix.
 */
FLOWEDGE_C_EXPORT fe_status fe_engine_sample(fe_engine* engine, const int32_t* tokens, size_t n_tokens,
                                             const float* noise, size_t noise_len, const char* solver, int32_t steps,
                                             float* out, size_t out_len);

/**
 * Flow head alone from an external condition. cond: [batch, Cd]; noise, out: [batch, A]; batch <= max_batch.
 * Works on head-only and full mamba-flow files.
 */
FLOWEDGE_C_EXPORT fe_status fe_engine_sample_condition(fe_engine* engine, const float* cond, size_t cond_len,
                                                       const float* noise, size_t noise_len, int32_t batch,
                                                       const char* solver, int32_t steps, float* out, size_t out_len);

/** Backbone prefill from a fresh state: tokens [n_tokens] -> hidden [n_tokens, d_model]; the state then holds
 *  the sequence, so fe_engine_step continues it. */
FLOWEDGE_C_EXPORT fe_status fe_engine_prefill(fe_engine* engine, const int32_t* tokens, size_t n_tokens,
                                              float* hidden, size_t hidden_len);

/** Streaming decode of one token: hidden [d_model] is that token's final-norm hidden state. */
FLOWEDGE_C_EXPORT fe_status fe_engine_step(fe_engine* engine, int32_t token, float* hidden, size_t hidden_len);

/** Forgets the decoded sequence (the next step starts a new one). */
FLOWEDGE_C_EXPORT fe_status fe_engine_reset(fe_engine* engine);

/** Bytes of an exported decode state (header + conv and SSM state of every layer). */
FLOWEDGE_C_EXPORT fe_status fe_engine_state_size(const fe_engine* engine, size_t* out_bytes);

/** Writes the decode state to buf (buf_bytes >= fe_engine_state_size); *written (may be NULL) gets the size.
 *  The format is versioned and checksummed, tied to this model's weights and shapes. */
FLOWEDGE_C_EXPORT fe_status fe_engine_export_state(fe_engine* engine, void* buf, size_t buf_bytes, size_t* written);

/** Restores a state written by fe_engine_export_state of the same model; anything else is FE_ERR_STATE and the
 *  current state is left unchanged. */
FLOWEDGE_C_EXPORT fe_status fe_engine_import_state(fe_engine* engine, const void* buf, size_t buf_bytes);

/* ---- diffusion ---- */

/**
 * Diffusion Policy sampling. cond: [batch, global_cond_dim]; noise: [batch, horizon, A] (standard normal,
 * normalised units); out: [batch, horizon, A] un-normalised (MIN_MAX) actions. batch in [1, max_batch];
 * steps in [1, num_train_timesteps]; scheduler "ddim" | "ddpm" (NULL = "ddim"); seed drives the DDPM noise
 * (batch element b uses seed + b; ignored by DDIM). Results do not depend on the thread count; on the CPU a row
 * of a batch >= 2 may differ from the same input at batch 1 in the last bits (the linear layers' kernels reduce a
 * one-column product in another order; about 1e-6 normalised, see docs/status.md).
 */
FLOWEDGE_C_EXPORT fe_status fe_engine_sample_diffusion(fe_engine* engine, const float* cond, size_t cond_len,
                                                       const float* noise, size_t noise_len, int32_t batch,
                                                       int32_t steps, const char* scheduler, uint64_t seed,
                                                       float* out, size_t out_len);

/** Arithmetic of the U-Net convolutions: "f32" (exact, the default), or the opt-in tensor-core modes "tf32" /
 *  "bf16" (CUDA sm_80+, used for batched calls where batch * length >= 256; a CPU engine computes exactly). Error vs
 *  "f32" per convolution output: TF32 <= ~1.3e-3, BF16 <= ~8.1e-3 times sum |w||x|. Unknown names are
 *  FE_ERR_INVALID_ARGUMENT. On a mamba-flow engine it sets the arithmetic of every projection of the backbone and
 *  the flow head (MambaFlowPolicy::set_math): "bf16" rounds activations (and F32 weights) to BF16 per product with
 *  float accumulation where the build has BF16 kernels (CPU: AVX512_BF16, rows longer than 8), "tf32" and "f32"
 *  compute exactly on the CPU. */
FLOWEDGE_C_EXPORT fe_status fe_engine_set_math(fe_engine* engine, const char* math);

/** One U-Net call: eps = unet(sample, timestep, cond). cond: [batch, global_cond_dim]; sample, eps:
 *  [batch, horizon, A] in normalised units; timestep in [0, num_train_timesteps). */
FLOWEDGE_C_EXPORT fe_status fe_engine_diffusion_denoise(fe_engine* engine, const float* cond, size_t cond_len,
                                                        const float* sample, size_t sample_len, int32_t batch,
                                                        int32_t timestep, float* eps, size_t eps_len);

/* ---- whole LeRobot policies: Diffusion Policy and ACT (encoders + queues + normalisation + network) ---- */

/**
 * A LeRobot pretrained_model folder as LeRobot's reset() / select_action() run it; opaque. The class is chosen by
 * config.json's "type" (fe_policy_type): "diffusion" (observation normalisation, RGB encoders, the n_obs_steps
 * observation queue, the sampler, the n_action_steps action queue and un-normalisation) or "act" (Action Chunking
 * with Transformers: ResNet18 backbones, the transformer, the n_action_steps queue or temporal ensembling). Like
 * fe_engine it may be used from any thread; calls on one policy are serialised.
 */
typedef struct fe_policy fe_policy;

/** How one camera frame is laid out in host memory. */
typedef enum fe_image_layout {
    FE_IMAGE_U8_HWC = 0,  /**< uint8 [height, width, channels], as a camera delivers it (value / 255) */
    FE_IMAGE_F32_CHW = 1  /**< float32 [channels, height, width], values in [0, 1] */
} fe_image_layout;

/** One camera frame. data holds height * width * channels elements of the layout's type. */
typedef struct fe_frame {
    const void* data;
    int32_t layout; /**< an fe_image_layout */
    int32_t height, width;
} fe_frame;

/**
 * One observation step. state: [state_dim] (LeRobot "observation.state"); env_state: [env_dim]
 * ("observation.environment_state"; NULL and 0 when the policy has none); frames: one per camera in
 * fe_policy_camera() index order. Everything is read during the call only.
 */
typedef struct fe_observation {
    const float* state;
    size_t state_len;
    const float* env_state;
    size_t env_state_len;
    const fe_frame* frames;
    size_t n_frames;
} fe_observation;

/** ACT's action selection, replacing config.json's (LeRobot's eval-time --policy.temporal_ensemble_coeff and
 *  --policy.n_action_steps), checked by LeRobot's rules. */
typedef struct fe_act_selection {
    int32_t temporal_ensemble;      /**< 1: a chunk every step, ensembled with weights exp(-coeff * i) (n_action_steps
                                         must be 1); 0: the n_action_steps queue */
    double temporal_ensemble_coeff; /**< the coefficient when temporal_ensemble is 1 (LeRobot's default 0.01) */
    int32_t n_action_steps;         /**< actions taken from each chunk, 1..chunk_size */
} fe_act_selection;

/** Load-time choices of fe_policy_load_ex; zero-initialise and set what you need. steps, scheduler and seed are
 *  Diffusion Policy options: for an ACT folder a non-zero steps or a scheduler is FE_ERR_INVALID_ARGUMENT and the seed
 *  is ignored (ACT draws no noise). act_selection is for ACT folders only (FE_ERR_INVALID_ARGUMENT otherwise). */
typedef struct fe_policy_options {
    const char* dtype;     /**< weight storage: NULL or "f32" (default), "bf16", "f16" */
    int32_t steps;         /**< inference steps; 0 = the checkpoint's num_inference_steps (else num_train_timesteps) */
    const char* scheduler; /**< "ddim" | "ddpm"; NULL = the checkpoint's noise_scheduler_type */
    uint64_t seed;         /**< seed of the generated noise when select_action gets none */
    const fe_act_selection* act_selection; /**< ACT: NULL = the checkpoint's temporal_ensemble_coeff and n_action_steps */
    int32_t batch;         /**< Diffusion Policy: environments served per fe_policy_select_action_batch (0 = 1); ACT: 0 or 1 */
    const char* quantize;  /**< Diffusion Policy, CPU: NULL or "none" (default), "int8" (INT8 weight-only U-Net convolutions,
                                AVX2 / AVX-512) or "w8a8" (INT8 weights and activations, AVX-512 with VNNI); opt-in, error
                                bounds in docs/numerics.md. A CPU without those kernels is FE_ERR_UNSUPPORTED, device
                                "cuda" FE_ERR_DEVICE (no INT8 GPU kernels; "auto" runs on the CPU and says why), an
                                ACT folder or an unknown name FE_ERR_INVALID_ARGUMENT */
} fe_policy_options;

/**
 * Loads a LeRobot DiffusionPolicy or ACT pretrained_model folder (config.json, model.safetensors and the
 * policy_preprocessor/postprocessor files, or the legacy normalize_* buffers), choosing the class by config.json's
 * "type". device: as fe_engine_load ("cpu", "cuda" which fails with FE_ERR_DEVICE unless resident, "auto" with the
 * CPU fallback reported by fe_policy_fallback_reason; NULL = "cpu"), for either policy type. Scheduler and steps default to the
 * checkpoint's, seed 0, F32 weights. The policy must be reset before its first select_action. On failure *out is
 * set to NULL.
 */
FLOWEDGE_C_EXPORT fe_status fe_policy_load(const char* folder, const char* device, fe_policy** out);

/** fe_policy_load with options (NULL = the defaults). Unknown dtype/scheduler names, steps outside
 *  [0, num_train_timesteps], options of the other policy type and an act_selection LeRobot's rules reject
 *  (n_action_steps outside 1..chunk_size, ensembling with n_action_steps != 1, a non-finite coefficient) are
 *  FE_ERR_INVALID_ARGUMENT. */
FLOWEDGE_C_EXPORT fe_status fe_policy_load_ex(const char* folder, const char* device, const fe_policy_options* options,
                                              fe_policy** out);

/** Frees a policy and everything it holds. NULL is a no-op. */
FLOWEDGE_C_EXPORT void fe_policy_free(fe_policy* policy);

/** LeRobot's reset(): empties the observation and action queues (ACT: the action queue or the temporal ensemble);
 *  call at every episode start. seed: NULL keeps the current seed of the generated noise, otherwise it replaces it
 *  (ignored by ACT, which draws no noise). */
FLOWEDGE_C_EXPORT fe_status fe_policy_reset(fe_policy* policy, const uint64_t* seed);

/**
 * LeRobot's select_action(): pushes the observation on the queue and writes the next action, un-normalised:
 * action [action_dim] (action_len >= action_dim). A new chunk is generated when the action queue is empty (every
 * n_action_steps calls), from seeded noise (fe_policy_options.seed) for a Diffusion Policy; an ACT policy with
 * temporal ensembling predicts a chunk every call. Errors: select_action before fe_policy_reset,
 * a NULL or undersized field (FE_ERR_INVALID_ARGUMENT, naming the feature key and the needed size), a state or
 * frame list longer than the policy's, a frame of the wrong height/width (FE_ERR_SHAPE, naming the camera key and
 * the expected size), a NaN/Inf state or float frame (FE_ERR_NON_FINITE). A failed call leaves the queues as they were.
 */
FLOWEDGE_C_EXPORT fe_status fe_policy_select_action(fe_policy* policy, const fe_observation* obs, float* action,
                                                    size_t action_len);

/** fe_policy_select_action with caller noise: noise [horizon, action_dim] standard normal (normalised units) is the
 *  initial sample of the chunk when this call generates one, and is ignored otherwise. For replay, pass the k-th
 *  chunk's noise with k = fe_policy_chunks_generated() before the call. Diffusion Policy only: on an ACT policy it
 *  is FE_ERR_UNSUPPORTED. */
FLOWEDGE_C_EXPORT fe_status fe_policy_select_action_noise(fe_policy* policy, const fe_observation* obs,
                                                          const float* noise, size_t noise_len, float* action,
                                                          size_t action_len);

/**
 * fe_policy_select_action for every environment of a policy loaded with fe_policy_options.batch = N (N >= 1): obs
 * holds n_obs == N observations, one per environment; actions [N, action_dim] row-major (actions_len >= N *
 * action_dim) receives each environment's next action. Each environment has its own queues and seed (environment e
 * draws from seed + (e << 32)); those whose action queue is empty are sampled together in one call. noise: NULL
 * for seeded noise, else [N, horizon, action_dim] of which row e is used only when environment e generates a chunk
 * at this call (noise_len >= N * horizon * action_dim). The frames of one camera must share a layout across the
 * environments. Errors as fe_policy_select_action, naming the environment ("policy env 2: ..."); n_obs other than
 * N is FE_ERR_SHAPE. Diffusion Policy only (an ACT policy serves one environment: FE_ERR_UNSUPPORTED).
 */
FLOWEDGE_C_EXPORT fe_status fe_policy_select_action_batch(fe_policy* policy, const fe_observation* obs, size_t n_obs,
                                                          const float* noise, size_t noise_len, float* actions,
                                                          size_t actions_len);

/** fe_policy_reset of environment `env` (0 <= env < batch) alone; seed: NULL keeps that environment's seed, otherwise
 *  it gets *seed + (env << 32) (what fe_policy_reset(seed) gives it). ACT: env must be 0. */
FLOWEDGE_C_EXPORT fe_status fe_policy_reset_env(fe_policy* policy, int32_t env, const uint64_t* seed);

/* ---- policy introspection: value, 0 when the policy has no such quantity, -1 (and fe_last_error) for NULL ---- */

/** Environments served per call (fe_policy_options.batch; 1 for ACT). */
FLOWEDGE_C_EXPORT int32_t fe_policy_batch(const fe_policy* policy);
/** fe_policy_chunks_generated of environment `env`; -1 (and fe_last_error) for NULL or an index out of range. */
FLOWEDGE_C_EXPORT int32_t fe_policy_env_chunks_generated(fe_policy* policy, int32_t env);

FLOWEDGE_C_EXPORT int32_t fe_policy_action_dim(const fe_policy* policy);
FLOWEDGE_C_EXPORT int32_t fe_policy_state_dim(const fe_policy* policy);
/** Width of "observation.environment_state" (0 when the policy has none). */
FLOWEDGE_C_EXPORT int32_t fe_policy_env_dim(const fe_policy* policy);
FLOWEDGE_C_EXPORT int32_t fe_policy_n_cameras(const fe_policy* policy);
/** Actions per chunk: the Diffusion Policy's horizon, ACT's chunk_size. */
FLOWEDGE_C_EXPORT int32_t fe_policy_horizon(const fe_policy* policy);
FLOWEDGE_C_EXPORT int32_t fe_policy_n_obs_steps(const fe_policy* policy);
/** Actions taken per chunk (1 for ACT with temporal ensembling); n_obs_steps is 1 for ACT. */
FLOWEDGE_C_EXPORT int32_t fe_policy_n_action_steps(const fe_policy* policy);
/** Inference steps used per chunk (the options' or the checkpoint's); 0 for ACT. */
FLOWEDGE_C_EXPORT int32_t fe_policy_steps(const fe_policy* policy);
/** Chunks generated since the last reset (the last select_action generated one when this grew); environment 0's
 *  with a batch. */
FLOWEDGE_C_EXPORT int32_t fe_policy_chunks_generated(fe_policy* policy);
/** Feature keys: "observation.state" and the environment-state key ("" when none). Never NULL. */
FLOWEDGE_C_EXPORT const char* fe_policy_state_key(const fe_policy* policy);
FLOWEDGE_C_EXPORT const char* fe_policy_env_key(const fe_policy* policy);
/** Camera `index` (0 <= index < n_cameras): its feature key ("observation.image", "observation.images.<cam>"; valid
 *  until the policy is freed) and frame shape. Any output pointer may be NULL. */
FLOWEDGE_C_EXPORT fe_status fe_policy_camera(const fe_policy* policy, int32_t index, const char** key,
                                             int32_t* channels, int32_t* height, int32_t* width);
/** "diffusion" or "act": the class config.json's "type" chose ("" for NULL). Never NULL. */
FLOWEDGE_C_EXPORT const char* fe_policy_type(const fe_policy* policy);
/** "cpu" or "cuda" ("" for NULL). Never NULL. */
FLOWEDGE_C_EXPORT const char* fe_policy_backend(const fe_policy* policy);
/** 1 when the policy runs on the GPU, 0 otherwise (also for NULL). */
FLOWEDGE_C_EXPORT int fe_policy_cuda_resident(const fe_policy* policy);
/** Why a device "auto" policy runs on the CPU ("" otherwise). Never NULL; valid until the policy is freed. */
FLOWEDGE_C_EXPORT const char* fe_policy_fallback_reason(const fe_policy* policy);
/** Bytes the policy holds on its backend (weights, buffers, workspaces; ACT: buffers and workspace, its weights stay
 *  mapped from the file); 0 for NULL. */
FLOWEDGE_C_EXPORT size_t fe_policy_device_bytes(fe_policy* policy);
/** Arithmetic of the policy's products, as fe_engine_set_math: "f32" (exact, the default), or the opt-in tensor-core
 *  modes "tf32" / "bf16" (any case). Diffusion: the U-Net convolutions (DiffusionPolicy::set_math; the encoder stays
 *  exact). ACT (ActPolicy::set_math): on CUDA sm_80+ the linears of >= 32 rows and the backbone's convolutions run
 *  TF32 tensor-core GEMMs (F32 weights: "bf16" computes as "tf32"); attention, LayerNorm and normalisation stay exact.
 *  A CPU policy accepts every mode: "tf32" computes exactly; "bf16" rounds the operands to BF16 (float accumulation)
 *  where the CPU has AVX512_BF16, in the Diffusion U-Net's convolutions and in ACT's linears with rows longer than 8
 *  (ACT's convolutions stay exact). The next chunk records its graph again. NULL or unknown names:
 *  FE_ERR_INVALID_ARGUMENT. */
FLOWEDGE_C_EXPORT fe_status fe_policy_set_math(fe_policy* policy, const char* math);

/* ---- real-time options (docs/realtime.md) ---- */

/** Run-time choices for a real-time control loop; zero-initialise and set what you need (all 0 changes nothing). */
typedef struct fe_realtime_options {
    int32_t lock_memory;          /**< 1: mlockall(MCL_CURRENT | MCL_FUTURE): every page faulted in and kept in RAM.
                                       Needs RLIMIT_MEMLOCK >= the mapped size (VmSize) or CAP_IPC_LOCK */
    int32_t prefault;             /**< 1: fault in every mapped page without locking (implied by lock_memory) */
    const int32_t* cpus;          /**< CPUs for the calling thread and the OpenMP workers (thread i on
                                       cpus[i % n_cpus]); NULL / 0 leaves the affinity alone */
    size_t n_cpus;
    int32_t rt_priority;          /**< SCHED_FIFO priority 1..99 for the same threads; 0 leaves the policy alone.
                                       Needs RLIMIT_RTPRIO >= it or CAP_SYS_NICE */
    int32_t high_priority_stream; /**< 1: a CUDA policy runs on a stream of the device's highest priority */
    int32_t pinned_staging;       /**< 1: a CUDA policy copies through page-locked host buffers */
    int32_t isolate_cpus;         /**< 1: move the process's other threads (CUDA driver, loggers) off `cpus` onto the
                                       other allowed CPUs; needs cpus and at least one allowed CPU outside them */
} fe_realtime_options;

/** The process and thread part of `options` (lock / pre-fault, CPUs, priority) for any engine: call it from the
 *  thread that will run the control loop, after loading, before the warm-up calls. The CUDA fields are ignored.
 *  FE_ERR_INVALID_ARGUMENT: a CPU that does not exist or is not in the process's cpuset, a priority outside 1..99;
 *  FE_ERR_UNSUPPORTED: the system refused (fe_last_error names the limit, the bytes needed and the fix:
 *  `ulimit -l` / `ulimit -r`, limits.conf memlock / rtprio, CAP_IPC_LOCK / CAP_SYS_NICE). */
FLOWEDGE_C_EXPORT fe_status fe_realtime_apply(const fe_realtime_options* options);

/** fe_realtime_apply plus the policy's own options (high_priority_stream, pinned_staging on a CUDA-resident policy;
 *  ignored on the CPU). Same statuses. */
FLOWEDGE_C_EXPORT fe_status fe_policy_set_realtime(fe_policy* policy, const fe_realtime_options* options);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLOWEDGE_C_API_H */
