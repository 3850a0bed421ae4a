/* test_c_api: exercises every entry point of include/flowedge/c_api.h from plain C99, against the C++ programs'
 * printed results and against itself (batch vs single, prefill vs step, state round trips, seeds). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flowedge/c_api.h>

static int n_pass = 0, n_fail = 0;

static void report(int ok, const char* file, int line, const char* expr, const char* fmt, ...) {
    va_list ap;
    if (ok) {
        n_pass++;
        return;
    }
    n_fail++;
    printf("FAIL %s:%d: %s: ", file, line, expr);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("  [last error: %s]\n", fe_last_error());
}

#define CHECK(cond, ...) report((cond) ? 1 : 0, __FILE__, __LINE__, #cond, __VA_ARGS__)
#define CHECK_STATUS(call, expect)                                                                         \
    do {                                                                                                   \
        fe_status s_ = (call);                                                                             \
        report(s_ == (expect), __FILE__, __LINE__, #call, "got %s, expected %s", fe_status_name(s_),       \
               fe_status_name(expect));                                                                    \
    } while (0)
/* The last error must mention `needle` (argument names, needed sizes). */
#define CHECK_MSG(needle) \
    report(strstr(fe_last_error(), (needle)) != NULL, __FILE__, __LINE__, "message mentions", "'%s'", (needle))

static int close_to(float a, float b, float rel) { return fabsf(a - b) <= rel * (1.f + fabsf(b)); }

static float max_rel_diff(const float* a, const float* b, size_t n) {
    float m = 0.f;
    size_t i;
    for (i = 0; i < n; ++i) {
        float d = fabsf(a[i] - b[i]) / (1.f + fabsf(b[i]));
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

static int all_finite(const float* a, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i)
        if (!isfinite(a[i])) return 0;
    return 1;
}

static int usable(const char* p) { return p != NULL && strcmp(p, "-") != 0; }

/* Runs a command and returns its stdout (malloc'ed, NUL-terminated) or NULL. */
static char* run_capture(const char* cmd) {
    FILE* f = popen(cmd, "r");
    char* buf;
    size_t len = 0, cap = 1 << 16, got;
    if (!f) return NULL;
    buf = (char*)malloc(cap);
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 == cap) {
            cap *= 2;
            buf = (char*)realloc(buf, cap);
        }
    }
    buf[len] = '\0';
    if (pclose(f) != 0) {
        printf("note: '%s' failed:\n%s\n", cmd, buf);
        free(buf);
        return NULL;
    }
    return buf;
}

static void set_env(const char* name, const char* value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Reads a little-endian C-order .npy of float32 ('<f4') or int32 ('<i4') into a malloc'ed buffer; NULL on failure. */
static void* load_npy(const char* dir, const char* name, const char* descr, size_t* count) {
    char path[4096], *hdr = NULL;
    unsigned char pre[10];
    size_t hlen, n = 1;
    void* data = NULL;
    const char* p;
    FILE* f;
    long end;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "rb");
    if (!f) return NULL;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0 || pre[6] != 1) goto fail;
    hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    hdr = (char*)calloc(hlen + 1, 1);
    if (fread(hdr, 1, hlen, f) != hlen) goto fail;
    if (!strstr(hdr, descr) || strstr(hdr, "'fortran_order': True")) goto fail;
    p = strstr(hdr, "'shape': (");
    if (!p) goto fail;
    p += strlen("'shape': (");
    while (*p && *p != ')') {
        char* e2;
        long d = strtol(p, &e2, 10);
        if (e2 == p) break;
        n *= (size_t)d;
        p = e2;
        while (*p == ',' || *p == ' ') ++p;
    }
    fseek(f, 0, SEEK_END);
    end = ftell(f);
    if (end < 0 || (size_t)end != 10 + hlen + 4 * n) goto fail;
    fseek(f, (long)(10 + hlen), SEEK_SET);
    data = malloc(4 * n + 4);
    if (fread(data, 4, n, f) != n) {
        free(data);
        data = NULL;
        goto fail;
    }
    *count = n;
fail:
    free(hdr);
    fclose(f);
    if (!data) printf("note: could not read %s\n", path);
    return data;
}

static float max_abs_diff(const float* a, const float* b, size_t n) {
    float m = 0.f;
    size_t i;
    for (i = 0; i < n; ++i) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* PyTorch (transformers Mamba + the flow head of docs/models.md#flow-matching-head) references written by the fixture generator. */
static void test_mamba_refs(const char* mamba, const char* ref) {
    fe_engine *e = NULL;
    size_t n_tok = 0, n_h = 0, n_c = 0, n_n = 0, n_r = 0, n = 0;
    int32_t* tok = (int32_t*)load_npy(ref, "tokens4.npy", "<i4", &n_tok);
    float* h_ref = (float*)load_npy(ref, "prefill4_hidden.npy", "<f4", &n_h);
    float* noise1 = (float*)load_npy(ref, "flow_noise1.npy", "<f4", &n_n);
    float* cond3 = (float*)load_npy(ref, "flow_cond3.npy", "<f4", &n_c);
    float* noise3 = (float*)load_npy(ref, "flow_noise3.npy", "<f4", &n);
    const char* solvers[3] = {"euler", "heun", "rk4"};
    float out[3 * 64], hidden[4 * 1024];
    int s;
    CHECK(tok && h_ref && noise1 && cond3 && noise3, "reference files readable in %s", ref);
    CHECK_STATUS(fe_engine_load_ex(mamba, "cpu", 3, 64, &e), FE_OK);
    if (!e || !tok || !h_ref || !noise1 || !cond3 || !noise3 || n_h > 4 * 1024 || n_n > 64 || n > 3 * 64) goto done;
    CHECK_STATUS(fe_engine_prefill(e, tok, n_tok, hidden, n_h), FE_OK);
    CHECK(max_rel_diff(hidden, h_ref, n_h) < 1e-4f, "prefill4 vs transformers: %g", (double)max_rel_diff(hidden, h_ref, n_h));
    for (s = 0; s < 3; ++s) {
        char name[64];
        float* r1;
        float* r3;
        snprintf(name, sizeof name, "flow1_%s_n10.npy", solvers[s]);
        r1 = (float*)load_npy(ref, name, "<f4", &n_r);
        CHECK_STATUS(fe_engine_sample(e, tok, n_tok, noise1, n_n, solvers[s], 10, out, sizeof out / sizeof out[0]), FE_OK);
        CHECK(r1 && n_r == n_n && max_rel_diff(out, r1, n_n) < 2e-3f, "%s: policy sample vs PyTorch %g", solvers[s],
              r1 ? (double)max_rel_diff(out, r1, n_n) : -1.0);
        free(r1);
        snprintf(name, sizeof name, "flow3_%s_n3.npy", solvers[s]);
        r3 = (float*)load_npy(ref, name, "<f4", &n_r);
        CHECK_STATUS(fe_engine_sample_condition(e, cond3, n_c, noise3, n, 3, solvers[s], 3, out, sizeof out / sizeof out[0]),
                     FE_OK);
        CHECK(r3 && n_r == n && max_rel_diff(out, r3, n) < 2e-3f, "%s: batch-3 condition sample vs PyTorch %g", solvers[s],
              r3 ? (double)max_rel_diff(out, r3, n) : -1.0);
        free(r3);
    }
done:
    fe_engine_free(e);
    free(tok);
    free(h_ref);
    free(noise1);
    free(cond3);
    free(noise3);
}

/* LeRobot DiffusionPolicy references (batch 2): U-Net epsilon, 10-step DDIM and seeded DDPM actions. */
static void test_diffusion_refs(const char* path, const char* ref) {
    fe_engine* e = NULL;
    size_t nc = 0, nn = 0, nr = 0;
    float* cond = (float*)load_npy(ref, "cond.npy", "<f4", &nc);
    float* noise = (float*)load_npy(ref, "noise.npy", "<f4", &nn);
    float* out = NULL;
    float* r = NULL;
    float span = 0.f;
    CHECK(cond && noise, "reference files readable in %s", ref);
    CHECK_STATUS(fe_engine_load_ex(path, "cpu", 2, 1, &e), FE_OK);
    if (!e || !cond || !noise) goto done;
    out = (float*)malloc(nn * sizeof(float));
    r = (float*)load_npy(ref, "eps_t50.npy", "<f4", &nr);
    CHECK_STATUS(fe_engine_diffusion_denoise(e, cond, nc, noise, nn, 2, 50, out, nn), FE_OK);
    CHECK(r && nr == nn && max_abs_diff(out, r, nn) < 3e-4f, "eps t=50 vs LeRobot: %g", r ? (double)max_abs_diff(out, r, nn) : -1.0);
    free(r);
    r = (float*)load_npy(ref, "ddim10_action.npy", "<f4", &nr);
    /* Whole-head bounds (docs/numerics.md#whole-head-tolerances) are in normalised units; actions are scaled by (max-min)/2 <= 250 for dp_small (refs.json). */
    span = 500.f;
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, nc, noise, nn, 2, 10, "ddim", 0, out, nn), FE_OK);
    CHECK(r && nr == nn && max_abs_diff(out, r, nn) < 6e-4f * span / 2.f, "DDIM10 actions vs LeRobot: %g (bound %g)",
          r ? (double)max_abs_diff(out, r, nn) : -1.0, (double)(6e-4f * span / 2.f));
    free(r);
    r = (float*)load_npy(ref, "ddpm10_action.npy", "<f4", &nr);
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, nc, noise, nn, 2, 10, "ddpm", 7, out, nn), FE_OK);
    CHECK(r && nr == nn && max_abs_diff(out, r, nn) < 8e-4f * span / 2.f, "DDPM10 seed 7 vs LeRobot: %g",
          r ? (double)max_abs_diff(out, r, nn) : -1.0);
done:
    free(r);
    free(out);
    free(cond);
    free(noise);
    fe_engine_free(e);
}


static void test_globals(void) {
    CHECK(fe_version() != NULL && strlen(fe_version()) >= 5, "version '%s'", fe_version());
    CHECK(fe_last_error() != NULL, "last error is never NULL");
    CHECK(strcmp(fe_last_error(), "") == 0, "no error yet, got '%s'", fe_last_error());
    /* The numeric values are ABI: they must never change. */
    CHECK(FE_OK == 0 && FE_ERR_INVALID_ARGUMENT == 1 && FE_ERR_IO == 2 && FE_ERR_FORMAT == 3 && FE_ERR_SHAPE == 4 &&
              FE_ERR_UNSUPPORTED == 5 && FE_ERR_NON_FINITE == 6 && FE_ERR_DEVICE == 7 && FE_ERR_STATE == 8 &&
              FE_ERR_INTERNAL == 9 && FE_ERR_OUT_OF_MEMORY == 10,
          "status values changed");
    CHECK(strcmp(fe_status_name(FE_ERR_SHAPE), "FE_ERR_SHAPE") == 0, "%s", fe_status_name(FE_ERR_SHAPE));
    CHECK(strcmp(fe_status_name((fe_status)1234), "FE_UNKNOWN") == 0, "%s", fe_status_name((fe_status)1234));
}

static void test_null_engine(void) {
    float buf[4] = {0};
    int32_t tok = 1;
    size_t sz = 0;
    fe_engine_free(NULL); /* no-op */
    CHECK(fe_engine_kind(NULL) == FE_KIND_NONE, "kind of NULL");
    CHECK(fe_engine_action_dim(NULL) == -1, "action_dim of NULL");
    CHECK(fe_engine_horizon(NULL) == -1 && fe_engine_condition_dim(NULL) == -1 && fe_engine_d_model(NULL) == -1 &&
              fe_engine_n_obs_steps(NULL) == -1 && fe_engine_n_action_steps(NULL) == -1 &&
              fe_engine_vocab_size(NULL) == -1 && fe_engine_num_train_timesteps(NULL) == -1 &&
              fe_engine_max_batch(NULL) == -1 && fe_engine_max_tokens(NULL) == -1,
          "introspection of NULL");
    CHECK_MSG("'engine' is NULL");
    CHECK(strcmp(fe_engine_backend(NULL), "") == 0, "backend of NULL");
    CHECK(fe_engine_cuda_resident(NULL) == 0, "cuda_resident of NULL");
    CHECK_STATUS(fe_engine_sample(NULL, &tok, 1, buf, 4, NULL, 1, buf, 4), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'engine'");
    CHECK_STATUS(fe_engine_sample_condition(NULL, buf, 4, buf, 4, 1, NULL, 1, buf, 4), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_prefill(NULL, &tok, 1, buf, 4), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_step(NULL, 1, buf, 4), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_reset(NULL), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_state_size(NULL, &sz), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_export_state(NULL, buf, sizeof buf, &sz), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_import_state(NULL, buf, sizeof buf), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_sample_diffusion(NULL, buf, 4, buf, 4, 1, 1, NULL, 0, buf, 4), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_diffusion_denoise(NULL, buf, 4, buf, 4, 1, 0, buf, 4), FE_ERR_INVALID_ARGUMENT);
}

static void test_load_errors(const char* mamba, const char* tmpdir) {
    fe_engine* e = (fe_engine*)0x1;
    char path[4096];
    FILE* f;
    CHECK_STATUS(fe_engine_load(NULL, "cpu", &e), FE_ERR_INVALID_ARGUMENT);
    CHECK(e == NULL, "out is reset to NULL on failure");
    CHECK_MSG("'path'");
    CHECK_STATUS(fe_engine_load(mamba, "cpu", NULL), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'out'");
    CHECK_STATUS(fe_engine_load("/nonexistent/flowedge/model.safetensors", "cpu", &e), FE_ERR_IO);
    CHECK_MSG("/nonexistent/flowedge/model.safetensors");
    CHECK_STATUS(fe_engine_load(mamba, "tpu", &e), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("tpu");
    CHECK_STATUS(fe_engine_load_ex(mamba, "cpu", 0, 16, &e), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("max_batch");
    CHECK_STATUS(fe_engine_load_ex(mamba, "cpu", 1, 0, &e), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("max_tokens");
    CHECK(e == NULL, "no engine after failures");
    CHECK(strncmp(fe_last_error(), "flowedge: ", 10) == 0, "message format: '%s'", fe_last_error());

    /* Garbage bytes with a huge header length. */
    snprintf(path, sizeof path, "%s/garbage.safetensors", tmpdir);
    f = fopen(path, "wb");
    if (f) {
        fputs("this is not a safetensors file at all, just text", f);
        fclose(f);
    }
    CHECK_STATUS(fe_engine_load(path, "cpu", &e), FE_ERR_FORMAT);
    /* A valid safetensors file with no model tensors in it. */
    snprintf(path, sizeof path, "%s/unrelated.safetensors", tmpdir);
    f = fopen(path, "wb");
    if (f) {
        const char hdr[] = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}   ";
        uint64_t n = sizeof hdr - 1;
        unsigned char le[8];
        float v = 1.f;
        int i;
        for (i = 0; i < 8; ++i) le[i] = (unsigned char)(n >> (8 * i));
        fwrite(le, 1, 8, f);
        fwrite(hdr, 1, (size_t)n, f);
        fwrite(&v, 4, 1, f);
        fclose(f);
    }
    CHECK_STATUS(fe_engine_load(path, "cpu", &e), FE_ERR_FORMAT);
    CHECK_MSG("not a flowedge checkpoint");
    /* The real file cut short. */
    snprintf(path, sizeof path, "%s/truncated.safetensors", tmpdir);
    {
        FILE* in = fopen(mamba, "rb");
        FILE* out = fopen(path, "wb");
        char chunk[4096];
        size_t got = in ? fread(chunk, 1, sizeof chunk, in) : 0;
        if (out) {
            fwrite(chunk, 1, got, out);
            fclose(out);
        }
        if (in) fclose(in);
    }
    CHECK_STATUS(fe_engine_load(path, "cpu", &e), FE_ERR_FORMAT);
    CHECK(e == NULL, "no engine");
}

/* Parses "action[0..2]=a, b, c" from flow_sample's output. */
static int parse_flow_sample(const char* text, float* v, int n) {
    const char* p = text ? strstr(text, "action[0..2]=") : NULL;
    int i;
    if (!p) return 0;
    p += strlen("action[0..2]=");
    for (i = 0; i < n; ++i) {
        char* end;
        v[i] = strtof(p, &end);
        if (end == p) return 0;
        p = end;
        while (*p == ',' || *p == ' ') ++p;
    }
    return 1;
}

static void test_mamba_flow(const char* mamba, const char* flow_sample, const char* mamba_forward) {
    fe_engine *e = NULL, *eb = NULL;
    int32_t A, dm, V, i, r;
    const int32_t tokens[4] = {1, 2, 3, 4};
    float noise[64], out1[64], out2[64], hidden[4 * 1024], h_step[1024];
    char cmd[8192];
    const char* solvers[3] = {"euler", "heun", "rk4"};

    CHECK_STATUS(fe_engine_load(mamba, "cpu", &e), FE_OK);
    if (!e) return;
    A = fe_engine_action_dim(e);
    dm = fe_engine_d_model(e);
    V = fe_engine_vocab_size(e);
    CHECK(fe_engine_kind(e) == FE_KIND_MAMBA_FLOW, "kind %d", (int)fe_engine_kind(e));
    CHECK(A > 0 && A <= 64, "action_dim %d", A);
    CHECK(dm > 0 && dm <= 1024, "d_model %d", dm);
    CHECK(V > 4, "vocab %d", V);
    CHECK(fe_engine_condition_dim(e) == dm, "condition_dim %d vs d_model %d", fe_engine_condition_dim(e), dm);
    CHECK(fe_engine_horizon(e) == 0 && fe_engine_n_obs_steps(e) == 0 && fe_engine_n_action_steps(e) == 0 &&
              fe_engine_num_train_timesteps(e) == 0,
          "diffusion-only quantities are 0");
    CHECK(fe_engine_max_batch(e) == 1 && fe_engine_max_tokens(e) == 512, "defaults %d %d", fe_engine_max_batch(e),
          fe_engine_max_tokens(e));
    CHECK(strcmp(fe_engine_backend(e), "cpu") == 0, "backend %s", fe_engine_backend(e));
    CHECK(fe_engine_cuda_resident(e) == 0, "not resident");
    if (A > 64 || dm > 1024) {
        fe_engine_free(e);
        return;
    }
    for (i = 0; i < A; ++i) noise[i] = sinf(0.3f * (float)i);

    /* fe_engine_sample: deterministic, and equal to flow_sample's printed action for every solver. */
    for (r = 0; r < 3; ++r) {
        CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, solvers[r], 10, out1, (size_t)A), FE_OK);
        CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, solvers[r], 10, out2, (size_t)A), FE_OK);
        CHECK(memcmp(out1, out2, sizeof(float) * (size_t)A) == 0, "%s: two calls differ", solvers[r]);
        CHECK(all_finite(out1, (size_t)A), "%s: finite", solvers[r]);
        if (usable(flow_sample)) {
            float ref[3];
            char* text;
            snprintf(cmd, sizeof cmd, "'%s' '%s' %s 10 --repeats 1", flow_sample, mamba, solvers[r]);
            text = run_capture(cmd);
            CHECK(parse_flow_sample(text, ref, A < 3 ? A : 3), "flow_sample output parsed");
            for (i = 0; i < (A < 3 ? A : 3); ++i)
                CHECK(close_to(out1[i], ref[i], 2e-5f), "%s action[%d] %.7g vs flow_sample %.7g", solvers[r], i,
                      (double)out1[i], (double)ref[i]);
            free(text);
        }
    }
    /* Different solvers give (slightly) different answers; NULL solver means euler. */
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, NULL, 10, out2, (size_t)A), FE_OK);
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "euler", 10, out1, (size_t)A), FE_OK);
    CHECK(memcmp(out1, out2, sizeof(float) * (size_t)A) == 0, "NULL solver == euler");
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "rk4", 10, out2, (size_t)A), FE_OK);
    CHECK(memcmp(out1, out2, sizeof(float) * (size_t)A) != 0, "euler and rk4 differ");

    /* Prefill vs streaming steps, and mamba_forward's printed out[0]. */
    CHECK_STATUS(fe_engine_prefill(e, tokens, 4, hidden, (size_t)(4 * dm)), FE_OK);
    CHECK_STATUS(fe_engine_reset(e), FE_OK);
    for (i = 0; i < 4; ++i) {
        CHECK_STATUS(fe_engine_step(e, tokens[i], h_step, (size_t)dm), FE_OK);
        CHECK(max_rel_diff(h_step, hidden + (size_t)i * (size_t)dm, (size_t)dm) < 1e-5f, "step %d vs prefill row: %g", i,
              (double)max_rel_diff(h_step, hidden + (size_t)i * (size_t)dm, (size_t)dm));
    }
    if (usable(mamba_forward)) {
        char* text;
        const char* p;
        snprintf(cmd, sizeof cmd, "'%s' '%s' 1 2 3 4", mamba_forward, mamba);
        text = run_capture(cmd);
        p = text ? strstr(text, "out[0]=") : NULL;
        CHECK(p != NULL, "mamba_forward printed out[0]");
        if (p) {
            float ref = strtof(p + 7, NULL);
            CHECK(close_to(hidden[3 * dm], ref, 2e-5f), "hidden[3][0] %.7g vs mamba_forward %.7g", (double)hidden[3 * dm],
                  (double)ref);
        }
        free(text);
    }

    /* The flow head alone from the backbone's last hidden row reproduces fe_engine_sample. */
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "heun", 7, out1, (size_t)A), FE_OK);
    CHECK_STATUS(fe_engine_sample_condition(e, hidden + 3 * dm, (size_t)dm, noise, (size_t)A, 1, "heun", 7, out2, (size_t)A),
                 FE_OK);
    CHECK(max_rel_diff(out2, out1, (size_t)A) < 1e-6f, "sample_condition(last row) vs sample: %g",
          (double)max_rel_diff(out2, out1, (size_t)A));

    /* Batch: every row of a batched call equals the single-row call with that noise. */
    CHECK_STATUS(fe_engine_load_ex(mamba, NULL, 3, 8, &eb), FE_OK);
    if (eb) {
        float nb[3 * 64], ob[3 * 64];
        CHECK(fe_engine_max_batch(eb) == 3 && fe_engine_max_tokens(eb) == 8, "sizes %d %d", fe_engine_max_batch(eb),
              fe_engine_max_tokens(eb));
        for (i = 0; i < 3 * A; ++i) nb[i] = cosf(0.7f * (float)i) * 1.3f;
        CHECK_STATUS(fe_engine_sample(eb, tokens, 4, nb, (size_t)(3 * A), "rk4", 5, ob, (size_t)(3 * A)), FE_OK);
        for (r = 0; r < 3; ++r) {
            CHECK_STATUS(fe_engine_sample(e, tokens, 4, nb + r * A, (size_t)A, "rk4", 5, out1, (size_t)A), FE_OK);
            CHECK(max_rel_diff(ob + r * A, out1, (size_t)A) < 1e-5f, "batch row %d vs single: %g", r,
                  (double)max_rel_diff(ob + r * A, out1, (size_t)A));
        }
        /* rows differ because their noise differs */
        CHECK(memcmp(ob, ob + A, sizeof(float) * (size_t)A) != 0, "batch rows differ");
        /* sample_condition with batch 2 and two conditions */
        {
            float cond2[2 * 1024];
            memcpy(cond2, hidden + 3 * dm, sizeof(float) * (size_t)dm);
            memcpy(cond2 + dm, hidden + 1 * dm, sizeof(float) * (size_t)dm);
            CHECK_STATUS(fe_engine_sample_condition(eb, cond2, (size_t)(2 * dm), nb, (size_t)(2 * A), 2, "euler", 10, ob,
                                                    (size_t)(2 * A)),
                         FE_OK);
            CHECK_STATUS(fe_engine_sample_condition(e, hidden + 1 * dm, (size_t)dm, nb + A, (size_t)A, 1, "euler", 10, out1,
                                                    (size_t)A),
                         FE_OK);
            CHECK(max_rel_diff(ob + A, out1, (size_t)A) < 1e-5f, "condition batch row 1 vs single: %g",
                  (double)max_rel_diff(ob + A, out1, (size_t)A));
        }
        /* max_tokens bounds the prefix; max_batch the batch */
        {
            int32_t nine[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
            CHECK_STATUS(fe_engine_sample(eb, nine, 9, nb, (size_t)A, "euler", 2, ob, (size_t)A), FE_ERR_INVALID_ARGUMENT);
            CHECK_MSG("n_tokens");
            CHECK_STATUS(fe_engine_sample(eb, tokens, 4, nb, (size_t)(4 * A), "euler", 2, ob, (size_t)(4 * A)),
                         FE_ERR_INVALID_ARGUMENT);
            CHECK_MSG("batch");
        }
        fe_engine_free(eb);
    }

    /* Argument errors. */
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "euler", 10, out1, (size_t)(A - 1)),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'out'");
    snprintf(cmd, sizeof cmd, "needs %d", A);
    CHECK_MSG(cmd);
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)(A - 1), "euler", 10, out1, (size_t)A),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'noise'");
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)(A + 1), "euler", 10, out1, 64), FE_ERR_SHAPE);
    CHECK_STATUS(fe_engine_sample(e, NULL, 4, noise, (size_t)A, "euler", 10, out1, (size_t)A), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'tokens'");
    CHECK_STATUS(fe_engine_sample(e, tokens, 0, noise, (size_t)A, "euler", 10, out1, (size_t)A), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, NULL, (size_t)A, "euler", 10, out1, (size_t)A), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "euler", 10, NULL, (size_t)A), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "midpoint", 10, out1, (size_t)A), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("midpoint");
    CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "euler", 0, out1, (size_t)A), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("steps");
    CHECK_STATUS(fe_engine_sample_condition(e, hidden, (size_t)dm + 1, noise, (size_t)A, 1, "euler", 3, out1, (size_t)A),
                 FE_ERR_SHAPE);
    CHECK_STATUS(fe_engine_sample_condition(e, hidden, (size_t)dm - 1, noise, (size_t)A, 1, "euler", 3, out1, (size_t)A),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'cond'");
    CHECK_STATUS(fe_engine_sample_condition(e, hidden, (size_t)dm, noise, (size_t)A, 0, "euler", 3, out1, (size_t)A),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_prefill(e, tokens, 4, hidden, (size_t)(4 * dm - 1)), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'hidden'");
    CHECK_STATUS(fe_engine_step(e, 1, h_step, (size_t)dm - 1), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'hidden'");

    /* Out-of-range token ids are errors, never reads out of bounds. */
    {
        int32_t bad[4] = {1, 2, 0, 4};
        bad[2] = V;
        CHECK_STATUS(fe_engine_step(e, -1, h_step, (size_t)dm), FE_ERR_INVALID_ARGUMENT);
        CHECK_MSG("token");
        CHECK_STATUS(fe_engine_step(e, V, h_step, (size_t)dm), FE_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(fe_engine_sample(e, bad, 4, noise, (size_t)A, "euler", 10, out1, (size_t)A), FE_ERR_INVALID_ARGUMENT);
        CHECK_MSG("position 2");
        CHECK_STATUS(fe_engine_prefill(e, bad, 4, hidden + 0, (size_t)(4 * dm)), FE_ERR_INVALID_ARGUMENT);
    }

    /* Non-finite inputs. */
    {
        float nan_noise[64];
        memcpy(nan_noise, noise, sizeof(float) * (size_t)A);
        nan_noise[A - 1] = (float)NAN;
        CHECK_STATUS(fe_engine_sample(e, tokens, 4, nan_noise, (size_t)A, "euler", 10, out1, (size_t)A), FE_ERR_NON_FINITE);
        CHECK_MSG("not finite");
        nan_noise[A - 1] = (float)INFINITY;
        CHECK_STATUS(fe_engine_sample(e, tokens, 4, nan_noise, (size_t)A, "euler", 10, out1, (size_t)A), FE_ERR_NON_FINITE);
        CHECK_STATUS(fe_engine_prefill(e, tokens, 4, hidden, (size_t)(4 * dm)), FE_OK);
        hidden[3 * dm + 5] = (float)NAN;
        CHECK_STATUS(fe_engine_sample_condition(e, hidden + 3 * dm, (size_t)dm, noise, (size_t)A, 1, "euler", 3, out1,
                                                (size_t)A),
                     FE_ERR_NON_FINITE);
        CHECK_MSG("condition");
    }

    /* Wrong kind. */
    CHECK_STATUS(fe_engine_sample_diffusion(e, noise, (size_t)A, noise, (size_t)A, 1, 10, "ddim", 0, out1, (size_t)A),
                 FE_ERR_UNSUPPORTED);
    CHECK_MSG("diffusion");
    CHECK_STATUS(fe_engine_diffusion_denoise(e, noise, (size_t)A, noise, (size_t)A, 1, 0, out1, (size_t)A),
                 FE_ERR_UNSUPPORTED);
    /* Math mode on a mamba-flow engine: exact modes reproduce the default bit for bit, bf16 is deterministic and
       close to f32 (its bound is tested in test/mamba_flow/test_math.cpp), unknown names are rejected. */
    {
        float m0[64], m1[64], m2[64];
        CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "euler", 10, m0, (size_t)A), FE_OK);
        CHECK_STATUS(fe_engine_set_math(e, "tf32"), FE_OK);
        CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "euler", 10, m1, (size_t)A), FE_OK);
        if (strcmp(fe_engine_backend(e), "cpu") == 0)
            CHECK(memcmp(m0, m1, (size_t)A * sizeof(float)) == 0, "tf32 request on a CPU mamba-flow engine computes exactly");
        CHECK_STATUS(fe_engine_set_math(e, "bf16"), FE_OK);
        CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "euler", 10, m1, (size_t)A), FE_OK);
        CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "euler", 10, m2, (size_t)A), FE_OK);
        CHECK(memcmp(m1, m2, (size_t)A * sizeof(float)) == 0, "bf16 math deterministic");
        for (i = 0; i < A; ++i) CHECK(fabsf(m1[i] - m0[i]) <= 2e-2f * (1.f + fabsf(m0[i])), "bf16 math near f32 at %d", (int)i);
        CHECK_STATUS(fe_engine_set_math(e, "fp8"), FE_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(fe_engine_set_math(e, "f32"), FE_OK);
        CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "euler", 10, m2, (size_t)A), FE_OK);
        CHECK(memcmp(m0, m2, (size_t)A * sizeof(float)) == 0, "back to f32: bit-identical to the default");
    }

    /* Decode state: export, continue, import, continue again -> identical. */
    {
        size_t sz = 0, written = 0;
        unsigned char *st, *st2;
        float ha[1024], hb[1024], hc[1024];
        CHECK_STATUS(fe_engine_state_size(e, &sz), FE_OK);
        CHECK(sz > 80, "state size %zu", sz);
        CHECK_STATUS(fe_engine_state_size(e, NULL), FE_ERR_INVALID_ARGUMENT);
        st = (unsigned char*)malloc(sz + 16);
        st2 = (unsigned char*)malloc(sz + 16);
        CHECK_STATUS(fe_engine_prefill(e, tokens, 3, hidden, (size_t)(3 * dm)), FE_OK);
        CHECK_STATUS(fe_engine_export_state(e, st, sz - 1, &written), FE_ERR_INVALID_ARGUMENT);
        CHECK_MSG("'buf'");
        snprintf(cmd, sizeof cmd, "needs %zu bytes", sz);
        CHECK_MSG(cmd);
        CHECK_STATUS(fe_engine_export_state(e, st, sz + 16, &written), FE_OK);
        CHECK(written == sz, "written %zu of %zu", written, sz);
        CHECK_STATUS(fe_engine_step(e, 4, ha, (size_t)dm), FE_OK);
        CHECK_STATUS(fe_engine_import_state(e, st, sz), FE_OK);
        CHECK_STATUS(fe_engine_step(e, 4, hb, (size_t)dm), FE_OK);
        CHECK(memcmp(ha, hb, sizeof(float) * (size_t)dm) == 0, "step after import == step after export");
        CHECK_STATUS(fe_engine_prefill(e, tokens, 4, hidden, (size_t)(4 * dm)), FE_OK);
        CHECK(max_rel_diff(ha, hidden + 3 * dm, (size_t)dm) < 1e-5f, "prefill(1..3)+step(4) == prefill(1..4)[3]: %g",
              (double)max_rel_diff(ha, hidden + 3 * dm, (size_t)dm));
        /* Rejected imports leave the state as it was. */
        CHECK_STATUS(fe_engine_import_state(e, st, sz), FE_OK);
        memcpy(st2, st, sz);
        st2[sz - 3] ^= 0x5a; /* payload byte */
        CHECK_STATUS(fe_engine_import_state(e, st2, sz), FE_ERR_STATE);
        CHECK_MSG("checksum");
        memcpy(st2, st, sz);
        st2[0] = 'X'; /* magic */
        CHECK_STATUS(fe_engine_import_state(e, st2, sz), FE_ERR_STATE);
        CHECK_STATUS(fe_engine_import_state(e, st, sz + 4), FE_ERR_STATE);
        CHECK_STATUS(fe_engine_import_state(e, st, sz - 1), FE_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(fe_engine_import_state(e, NULL, sz), FE_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(fe_engine_step(e, 4, hc, (size_t)dm), FE_OK);
        CHECK(memcmp(ha, hc, sizeof(float) * (size_t)dm) == 0, "state unchanged by rejected imports");
        /* reset forgets: step(4) from scratch differs from step(4) after 1 2 3 */
        CHECK_STATUS(fe_engine_reset(e), FE_OK);
        CHECK_STATUS(fe_engine_step(e, 4, hc, (size_t)dm), FE_OK);
        CHECK(memcmp(ha, hc, sizeof(float) * (size_t)dm) != 0, "reset forgets the prefix");
        free(st);
        free(st2);
    }
    fe_engine_free(e);
}

static void test_split_files(const char* mamba, const char* backbone_only, const char* head_only) {
    fe_engine *full = NULL, *bb = NULL, *hd = NULL;
    int32_t A, dm;
    const int32_t tokens[3] = {3, 1, 2};
    float hidden[3 * 1024], hidden_full[3 * 1024], h1[1024], noise[64], o1[64], o2[64];
    size_t sz = 0;
    int i;
    CHECK_STATUS(fe_engine_load(mamba, "cpu", &full), FE_OK);
    CHECK_STATUS(fe_engine_load(backbone_only, "cpu", &bb), FE_OK);
    CHECK_STATUS(fe_engine_load(head_only, "cpu", &hd), FE_OK);
    if (!full || !bb || !hd) goto done;
    A = fe_engine_action_dim(full);
    dm = fe_engine_d_model(full);
    CHECK(fe_engine_kind(bb) == FE_KIND_MAMBA_FLOW && fe_engine_kind(hd) == FE_KIND_MAMBA_FLOW, "kinds");
    CHECK(fe_engine_action_dim(bb) == 0 && fe_engine_d_model(bb) == dm, "backbone-only dims %d %d",
          fe_engine_action_dim(bb), fe_engine_d_model(bb));
    CHECK(fe_engine_d_model(hd) == 0 && fe_engine_action_dim(hd) == A && fe_engine_condition_dim(hd) == dm,
          "head-only dims");
    CHECK(fe_engine_max_tokens(hd) == 0 && fe_engine_vocab_size(hd) == 0, "head-only has no tokens");
    for (i = 0; i < A; ++i) noise[i] = 0.5f - 0.1f * (float)i;
    /* backbone-only: prefill works and equals the full file's; sampling is unsupported */
    CHECK_STATUS(fe_engine_prefill(bb, tokens, 3, hidden, (size_t)(3 * dm)), FE_OK);
    CHECK_STATUS(fe_engine_prefill(full, tokens, 3, hidden_full, (size_t)(3 * dm)), FE_OK);
    CHECK(memcmp(hidden, hidden_full, sizeof(float) * 3 * (size_t)dm) == 0, "backbone-only prefill == full file");
    CHECK_STATUS(fe_engine_step(bb, 2, h1, (size_t)dm), FE_OK);
    CHECK_STATUS(fe_engine_step(full, 2, o1, 0), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_sample(bb, tokens, 3, noise, (size_t)A, "euler", 4, o1, (size_t)A), FE_ERR_UNSUPPORTED);
    CHECK_MSG("flow head");
    CHECK_STATUS(fe_engine_sample_condition(bb, hidden, (size_t)dm, noise, (size_t)A, 1, "euler", 4, o1, (size_t)A),
                 FE_ERR_UNSUPPORTED);
    /* head-only: condition sampling equals the full file's; backbone calls are unsupported */
    CHECK_STATUS(fe_engine_sample_condition(hd, hidden + 2 * dm, (size_t)dm, noise, (size_t)A, 1, "rk4", 6, o1, (size_t)A),
                 FE_OK);
    CHECK_STATUS(fe_engine_sample_condition(full, hidden + 2 * dm, (size_t)dm, noise, (size_t)A, 1, "rk4", 6, o2, (size_t)A),
                 FE_OK);
    CHECK(memcmp(o1, o2, sizeof(float) * (size_t)A) == 0, "head-only == full file");
    CHECK_STATUS(fe_engine_sample(hd, tokens, 3, noise, (size_t)A, "euler", 4, o1, (size_t)A), FE_ERR_UNSUPPORTED);
    CHECK_MSG("backbone");
    CHECK_STATUS(fe_engine_step(hd, 1, h1, 1024), FE_ERR_UNSUPPORTED);
    CHECK_STATUS(fe_engine_reset(hd), FE_ERR_UNSUPPORTED);
    CHECK_STATUS(fe_engine_state_size(hd, &sz), FE_ERR_UNSUPPORTED);
done:
    fe_engine_free(full);
    fe_engine_free(bb);
    fe_engine_free(hd);
}

static void test_device(const char* mamba) {
    fe_engine *e = NULL, *c = NULL;
    const int32_t tokens[4] = {1, 2, 3, 4};
    float noise[64], o_cpu[64], o_dev[64];
    int32_t A;
    int i;
    set_env("FLOWEDGE_CUDA_REQUIRED", NULL);
    set_env("FLOWEDGE_CUDA_FORCE_HOST", NULL);
    CHECK_STATUS(fe_engine_load(mamba, "cpu", &c), FE_OK);
    if (!c) return;
    A = fe_engine_action_dim(c);
    for (i = 0; i < A; ++i) noise[i] = sinf(0.3f * (float)i);
    CHECK_STATUS(fe_engine_sample(c, tokens, 4, noise, (size_t)A, "euler", 10, o_cpu, (size_t)A), FE_OK);

    /* "cuda" is a promise: resident on the GPU or FE_ERR_DEVICE (naming "auto"), never a silent CPU engine. */
    {
        fe_status s = fe_engine_load(mamba, "cuda", &e);
        if (!fe_built_with_cuda()) {
            CHECK(s == FE_ERR_DEVICE, "no CUDA build: \"cuda\" fails, got %s", fe_status_name(s));
            CHECK_MSG("no CUDA backend");
            CHECK_MSG("\"auto\"");
        } else {
            CHECK(s == FE_OK ? fe_engine_cuda_resident(e) == 1 : s == FE_ERR_DEVICE, "\"cuda\": resident or DEVICE, got %s",
                  fe_status_name(s));
            if (s != FE_OK) CHECK_MSG("not resident on the GPU");
        }
        CHECK(s == FE_OK || e == NULL, "no engine on failure");
        fe_engine_free(e);
        e = NULL;
    }
    /* "auto" allows the fallback and says why. */
    CHECK_STATUS(fe_engine_load(mamba, "auto", &e), FE_OK);
    if (e) {
        if (!fe_built_with_cuda()) {
            CHECK(fe_engine_cuda_resident(e) == 0, "no CUDA build: falls back to the CPU");
            CHECK(strcmp(fe_engine_backend(e), "cpu") == 0, "backend %s", fe_engine_backend(e));
            CHECK(strstr(fe_engine_fallback_reason(e), "no CUDA backend") != NULL, "reason '%s'", fe_engine_fallback_reason(e));
        } else {
            CHECK(strcmp(fe_engine_backend(e), fe_engine_cuda_resident(e) ? "cuda" : "cpu") == 0, "backend %s vs resident %d",
                  fe_engine_backend(e), fe_engine_cuda_resident(e));
            CHECK((fe_engine_cuda_resident(e) != 0) == (fe_engine_fallback_reason(e)[0] == '\0'), "reason '%s' iff on the CPU",
                  fe_engine_fallback_reason(e));
            printf("note: CUDA build, device \"auto\" resident = %d\n", fe_engine_cuda_resident(e));
        }
        CHECK_STATUS(fe_engine_sample(e, tokens, 4, noise, (size_t)A, "euler", 10, o_dev, (size_t)A), FE_OK);
        CHECK(max_rel_diff(o_dev, o_cpu, (size_t)A) < 2e-3f, "device vs cpu %g", (double)max_rel_diff(o_dev, o_cpu, (size_t)A));
        fe_engine_free(e);
        e = NULL;
    }
    CHECK(strcmp(fe_engine_fallback_reason(c), "") == 0, "a cpu engine has no fallback reason");
    CHECK(strcmp(fe_engine_fallback_reason(NULL), "") == 0, "fallback reason of NULL");
    CHECK_STATUS(fe_engine_load(mamba, "gpu", &e), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("expected cpu, cuda or auto");
    /* FORCE_HOST skips the upload ("auto" runs on the CPU, "cuda" fails); REQUIRED makes a non-resident load fail
       (also together with FORCE_HOST). */
    set_env("FLOWEDGE_CUDA_FORCE_HOST", "1");
    CHECK_STATUS(fe_engine_load(mamba, "auto", &e), FE_OK);
    CHECK(e && fe_engine_cuda_resident(e) == 0, "FORCE_HOST -> CPU");
    CHECK(e && strstr(fe_engine_fallback_reason(e), "FORCE_HOST") != NULL, "reason names FORCE_HOST");
    fe_engine_free(e);
    e = NULL;
    CHECK_STATUS(fe_engine_load(mamba, "cuda", &e), FE_ERR_DEVICE);
    CHECK(e == NULL, "no engine");
    set_env("FLOWEDGE_CUDA_REQUIRED", "1");
    CHECK_STATUS(fe_engine_load(mamba, "auto", &e), FE_ERR_DEVICE);
    CHECK_MSG("FLOWEDGE_CUDA_REQUIRED");
    CHECK(e == NULL, "no engine");
    set_env("FLOWEDGE_CUDA_FORCE_HOST", NULL);
    if (!fe_built_with_cuda()) {
        CHECK_STATUS(fe_engine_load(mamba, "auto", &e), FE_ERR_DEVICE);
        CHECK(e == NULL, "no engine");
    } else {
        fe_status s = fe_engine_load(mamba, "auto", &e);
        CHECK(s == FE_OK ? fe_engine_cuda_resident(e) == 1 : s == FE_ERR_DEVICE, "REQUIRED: ok and resident, or DEVICE");
    }
    fe_engine_free(e);
    e = NULL;
    /* Only exactly "1" counts; REQUIRED does not affect a cpu request. */
    set_env("FLOWEDGE_CUDA_REQUIRED", "true");
    CHECK_STATUS(fe_engine_load(mamba, "auto", &e), FE_OK);
    fe_engine_free(e);
    e = NULL;
    set_env("FLOWEDGE_CUDA_REQUIRED", "1");
    CHECK_STATUS(fe_engine_load(mamba, "cpu", &e), FE_OK);
    fe_engine_free(e);
    set_env("FLOWEDGE_CUDA_REQUIRED", NULL);
    fe_engine_free(c);
}

/* Parses diffusion_sample's horizon lines ("  h: a b ...") into v[H*A]. */
static int parse_diffusion_sample(const char* text, float* v, int H, int A) {
    const char* p = text ? strstr(text, "executed:") : NULL;
    int h, a;
    if (!p) return 0;
    p = strchr(p, '\n');
    for (h = 0; h < H; ++h) {
        char* end;
        long row;
        if (!p) return 0;
        ++p;
        row = strtol(p, &end, 10);
        if (end == p || row != h || *end != ':') return 0;
        p = end + 1;
        for (a = 0; a < A; ++a) {
            v[h * A + a] = strtof(p, &end);
            if (end == p) return 0;
            p = end;
        }
        p = strchr(p, '\n');
    }
    return 1;
}

static void test_diffusion(const char* path, const char* compact, const char* diffusion_sample) {
    fe_engine *e = NULL, *e2 = NULL, *ek = NULL;
    int32_t A, H, G, T, i;
    size_t per, sz = 0;
    float *cond, *noise, *o1, *o2, *ob, *cond2, *noise2;
    char cmd[8192];
    CHECK_STATUS(fe_engine_load(path, "cpu", &e), FE_OK);
    if (!e) return;
    A = fe_engine_action_dim(e);
    H = fe_engine_horizon(e);
    G = fe_engine_condition_dim(e);
    T = fe_engine_num_train_timesteps(e);
    CHECK(fe_engine_kind(e) == FE_KIND_DIFFUSION, "kind");
    CHECK(A > 0 && H > 0 && G > 0 && T > 0, "dims %d %d %d %d", A, H, G, T);
    CHECK(fe_engine_n_obs_steps(e) >= 1 && fe_engine_n_action_steps(e) >= 1 &&
              fe_engine_n_obs_steps(e) - 1 + fe_engine_n_action_steps(e) <= H,
          "obs %d act %d", fe_engine_n_obs_steps(e), fe_engine_n_action_steps(e));
    CHECK(fe_engine_d_model(e) == 0 && fe_engine_vocab_size(e) == 0, "no backbone");
    per = (size_t)H * (size_t)A;
    cond = (float*)calloc(2 * (size_t)G, sizeof(float));
    cond2 = (float*)calloc(2 * (size_t)G, sizeof(float));
    noise = (float*)malloc(2 * per * sizeof(float));
    noise2 = (float*)malloc(2 * per * sizeof(float));
    o1 = (float*)malloc(2 * per * sizeof(float));
    o2 = (float*)malloc(2 * per * sizeof(float));
    ob = (float*)malloc(2 * per * sizeof(float));
    for (i = 0; i < (int32_t)per; ++i) noise[i] = sinf(0.37f * (float)(i + 1));

    /* DDIM 10 steps, zero condition: deterministic and equal to diffusion_sample's printed horizon. */
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 10, "ddim", 0, o1, per), FE_OK);
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 10, NULL, 0, o2, per), FE_OK);
    CHECK(memcmp(o1, o2, per * sizeof(float)) == 0, "two DDIM calls (NULL = ddim) identical");
    CHECK(all_finite(o1, per), "finite");
    /* Math mode: names are checked; a CPU engine computes exactly whatever was asked (bit-identical). */
    CHECK_STATUS(fe_engine_set_math(e, "tf32"), FE_OK);
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 10, "ddim", 0, o2, per), FE_OK);
    if (strcmp(fe_engine_backend(e), "cpu") == 0)
        CHECK(memcmp(o1, o2, per * sizeof(float)) == 0, "tf32 request on a CPU engine computes exactly");
    CHECK_STATUS(fe_engine_set_math(e, "fp8"), FE_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fe_last_error(), "fp8") != NULL, "unknown math mode named: %s", fe_last_error());
    CHECK_STATUS(fe_engine_set_math(e, NULL), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_set_math(NULL, "f32"), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_set_math(e, "F32"), FE_OK);
    if (usable(diffusion_sample)) {
        float* ref = (float*)malloc(per * sizeof(float));
        char* text;
        snprintf(cmd, sizeof cmd, "'%s' '%s' 10 --repeats 1", diffusion_sample, path);
        text = run_capture(cmd);
        CHECK(parse_diffusion_sample(text, ref, H, A), "diffusion_sample output parsed");
        for (i = 0; i < (int32_t)per; ++i)
            CHECK(close_to(o1[i], ref[i], 2e-5f), "horizon[%d] %.7g vs diffusion_sample %.7g", i, (double)o1[i],
                  (double)ref[i]);
        free(text);
        free(ref);
    }
    /* The compact export gives the same actions as the folder. */
    if (usable(compact)) {
        CHECK_STATUS(fe_engine_load(compact, "cpu", &ek), FE_OK);
        if (ek) {
            CHECK(fe_engine_kind(ek) == FE_KIND_DIFFUSION && fe_engine_horizon(ek) == H, "compact kind/horizon");
            CHECK_STATUS(fe_engine_sample_diffusion(ek, cond, (size_t)G, noise, per, 1, 10, "ddim", 0, o2, per), FE_OK);
            CHECK(memcmp(o1, o2, per * sizeof(float)) == 0, "compact == folder");
            fe_engine_free(ek);
        }
    }
    /* DDPM: same seed same actions, other seed other actions; batch element b uses seed + b. */
    for (i = 0; i < G; ++i) cond[i] = 0.1f * (float)(i % 7) - 0.3f;
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 10, "ddpm", 5, o1, per), FE_OK);
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 10, "DDPM", 5, o2, per), FE_OK);
    CHECK(memcmp(o1, o2, per * sizeof(float)) == 0, "same seed -> same actions");
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 10, "ddpm", 6, o2, per), FE_OK);
    CHECK(memcmp(o1, o2, per * sizeof(float)) != 0, "other seed -> other actions");
    CHECK_STATUS(fe_engine_load_ex(path, "cpu", 2, 1, &e2), FE_OK);
    if (e2) {
        memcpy(cond2, cond, (size_t)G * sizeof(float));
        memcpy(cond2 + G, cond, (size_t)G * sizeof(float));
        memcpy(noise2, noise, per * sizeof(float));
        memcpy(noise2 + per, noise, per * sizeof(float));
        CHECK_STATUS(fe_engine_sample_diffusion(e2, cond2, 2 * (size_t)G, noise2, 2 * per, 2, 10, "ddpm", 5, ob, 2 * per),
                     FE_OK);
        CHECK(max_rel_diff(ob, o1, per) < 1e-5f, "batch row 0 == seed 5: %g", (double)max_rel_diff(ob, o1, per));
        CHECK(max_rel_diff(ob + per, o2, per) < 1e-5f, "batch row 1 == seed 6: %g", (double)max_rel_diff(ob + per, o2, per));
        /* denoise: batch rows equal single calls */
        CHECK_STATUS(fe_engine_diffusion_denoise(e2, cond2, 2 * (size_t)G, noise2, 2 * per, 2, 42, ob, 2 * per), FE_OK);
        CHECK_STATUS(fe_engine_diffusion_denoise(e, cond, (size_t)G, noise, per, 1, 42, o1, per), FE_OK);
        CHECK(max_rel_diff(ob + per, o1, per) < 1e-5f, "denoise batch row 1 vs single: %g",
              (double)max_rel_diff(ob + per, o1, per));
        fe_engine_free(e2);
    }
    /* denoise depends on the timestep */
    CHECK_STATUS(fe_engine_diffusion_denoise(e, cond, (size_t)G, noise, per, 1, 0, o1, per), FE_OK);
    CHECK_STATUS(fe_engine_diffusion_denoise(e, cond, (size_t)G, noise, per, 1, T - 1, o2, per), FE_OK);
    CHECK(all_finite(o1, per) && memcmp(o1, o2, per * sizeof(float)) != 0, "eps(t=0) != eps(t=T-1)");

    /* Errors. */
    CHECK_STATUS(fe_engine_diffusion_denoise(e, cond, (size_t)G, noise, per, 1, T, o1, per), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("timestep");
    CHECK_STATUS(fe_engine_diffusion_denoise(e, cond, (size_t)G, noise, per, 1, -1, o1, per), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 0, "ddim", 0, o1, per), FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, T + 1, "ddim", 0, o1, per),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 10, "euler", 0, o1, per),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("euler");
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 10, "ddim", 0, o1, per - 1),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'out'");
    snprintf(cmd, sizeof cmd, "needs %zu", per);
    CHECK_MSG(cmd);
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G + 1, noise, per, 1, 10, "ddim", 0, o1, per), FE_ERR_SHAPE);
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G - 1, noise, per, 1, 10, "ddim", 0, o1, per),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'cond'");
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 2, 10, "ddim", 0, o1, per),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("batch");
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 0, 10, "ddim", 0, o1, per),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_sample_diffusion(e, NULL, (size_t)G, noise, per, 1, 10, "ddim", 0, o1, per),
                 FE_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fe_engine_diffusion_denoise(e, cond, (size_t)G, noise, per, 1, 3, o1, per - 1), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'eps'");
    cond[1] = (float)NAN;
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 10, "ddim", 0, o1, per), FE_ERR_NON_FINITE);
    CHECK_STATUS(fe_engine_diffusion_denoise(e, cond, (size_t)G, noise, per, 1, 3, o1, per), FE_ERR_NON_FINITE);
    cond[1] = 0.f;
    noise[0] = (float)INFINITY;
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 10, "ddim", 0, o1, per), FE_ERR_NON_FINITE);
    noise[0] = 0.f;
    /* Wrong kind. */
    {
        int32_t tok = 1;
        CHECK_STATUS(fe_engine_sample(e, &tok, 1, noise, (size_t)A, "euler", 2, o1, (size_t)A), FE_ERR_UNSUPPORTED);
        CHECK_MSG("mamba-flow");
        CHECK_STATUS(fe_engine_sample_condition(e, cond, (size_t)G, noise, (size_t)A, 1, "euler", 2, o1, (size_t)A),
                     FE_ERR_UNSUPPORTED);
        CHECK_STATUS(fe_engine_step(e, 1, o1, per), FE_ERR_UNSUPPORTED);
        CHECK_STATUS(fe_engine_prefill(e, &tok, 1, o1, per), FE_ERR_UNSUPPORTED);
        CHECK_STATUS(fe_engine_reset(e), FE_ERR_UNSUPPORTED);
        CHECK_STATUS(fe_engine_state_size(e, &sz), FE_ERR_UNSUPPORTED);
        CHECK_STATUS(fe_engine_export_state(e, o1, per * sizeof(float), &sz), FE_ERR_UNSUPPORTED);
        CHECK_STATUS(fe_engine_import_state(e, o1, per * sizeof(float)), FE_ERR_UNSUPPORTED);
    }
    /* The engine still works after all those failures. */
    CHECK_STATUS(fe_engine_sample_diffusion(e, cond, (size_t)G, noise, per, 1, 3, "ddim", 0, o1, per), FE_OK);
    free(cond);
    free(cond2);
    free(noise);
    free(noise2);
    free(o1);
    free(o2);
    free(ob);
    fe_engine_free(e);
}

/* fe_policy from C: the observation structs, reset, a full episode of select_action (3 chunks), a wrong state length.
 * Numbers against the C++ class are checked by test_policy_capi.cpp. */
static void test_policy(const char* folder) {
    fe_policy* p = NULL;
    fe_policy_options opts;
    float state[2], env[4], action[2], first[2];
    fe_observation obs;
    uint64_t seed = 3;
    int t, i, finite = 1;
    memset(&opts, 0, sizeof opts);
    opts.steps = 10;
    opts.scheduler = "ddim";
    CHECK_STATUS(fe_policy_load_ex(folder, "cpu", &opts, &p), FE_OK);
    if (p == NULL) return;
    CHECK(fe_policy_action_dim(p) == 2 && fe_policy_state_dim(p) == 2 && fe_policy_env_dim(p) == 4, "dims");
    CHECK(fe_policy_n_cameras(p) == 0 && fe_policy_steps(p) == 10, "cameras %d steps %d", fe_policy_n_cameras(p),
          fe_policy_steps(p));
    CHECK(strcmp(fe_policy_state_key(p), "observation.state") == 0, "state key %s", fe_policy_state_key(p));
    memset(&obs, 0, sizeof obs);
    obs.state = state;
    obs.state_len = 2;
    obs.env_state = env;
    obs.env_state_len = 4;
    CHECK_STATUS(fe_policy_reset(p, &seed), FE_OK);
    for (t = 0; t < 20; ++t) {
        for (i = 0; i < 2; ++i) state[i] = 100.f + 20.f * (float)t + (float)i;
        for (i = 0; i < 4; ++i) env[i] = 0.1f * (float)(t - i);
        CHECK_STATUS(fe_policy_select_action(p, &obs, action, 2), FE_OK);
        finite = finite && all_finite(action, 2);
        if (t == 0) memcpy(first, action, sizeof first);
    }
    CHECK(finite, "actions finite");
    CHECK(fe_policy_chunks_generated(p) == 3, "chunks %d", fe_policy_chunks_generated(p));
    /* same seed, same first observation: the same first action */
    CHECK_STATUS(fe_policy_reset(p, &seed), FE_OK);
    for (i = 0; i < 2; ++i) state[i] = 100.f + (float)i;
    for (i = 0; i < 4; ++i) env[i] = 0.1f * (float)(-i);
    CHECK_STATUS(fe_policy_select_action(p, &obs, action, 2), FE_OK);
    CHECK(action[0] == first[0] && action[1] == first[1], "repeat %g %g vs %g %g", action[0], action[1], first[0], first[1]);
    obs.state_len = 1;
    CHECK_STATUS(fe_policy_select_action(p, &obs, action, 2), FE_ERR_INVALID_ARGUMENT);
    CHECK_MSG("'observation.state') is too small: needs 2 floats");
    fe_policy_free(p);
}

int main(int argc, char** argv) {
    const char *mamba, *diffusion, *compact, *backbone_only, *head_only;
    const char *flow_sample = NULL, *mamba_forward = NULL, *diffusion_sample = NULL, *mamba_ref = NULL, *diffusion_ref = NULL;
    char tmpdir[] = "/tmp/flowedge_capi_XXXXXX";
    if (argc < 6) {
        fprintf(stderr,
                "usage: test_c_api MAMBA_FLOW DIFFUSION COMPACT|- BACKBONE_ONLY HEAD_ONLY [flow_sample|- mamba_forward|- "
                "diffusion_sample|- MAMBA_REF_DIR|- DIFFUSION_REF_DIR|-]\n");
        return 2;
    }
    mamba = argv[1];
    diffusion = argv[2];
    compact = argv[3];
    backbone_only = argv[4];
    head_only = argv[5];
    if (argc > 6) flow_sample = argv[6];
    if (argc > 7) mamba_forward = argv[7];
    if (argc > 8) diffusion_sample = argv[8];
    if (argc > 9) mamba_ref = argv[9];
    if (argc > 10) diffusion_ref = argv[10];
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    if (!usable(flow_sample)) printf("note: flow_sample not built; printed-value comparison skipped\n");
    if (!usable(mamba_forward)) printf("note: mamba_forward not built; printed-value comparison skipped\n");
    if (!usable(diffusion_sample)) printf("note: diffusion_sample not built; printed-value comparison skipped\n");

    test_globals();
    test_null_engine();
    test_load_errors(mamba, tmpdir);
    test_mamba_flow(mamba, flow_sample, mamba_forward);
    test_split_files(mamba, backbone_only, head_only);
    test_device(mamba);
    test_diffusion(diffusion, compact, diffusion_sample);
    if (strstr(diffusion, "dp_small") != NULL) test_policy(diffusion); /* the committed LeRobot folder with processors */
    else printf("note: no dp_small fixture; fe_policy C test skipped\n");
    if (usable(mamba_ref)) test_mamba_refs(mamba, mamba_ref);
    else printf("note: no mamba_flow reference arrays; PyTorch comparison skipped\n");
    if (usable(diffusion_ref)) test_diffusion_refs(diffusion, diffusion_ref);
    else printf("note: no diffusion reference arrays; LeRobot comparison skipped\n");

    {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) printf("note: could not remove %s\n", tmpdir);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 ? 0 : 1;
}
