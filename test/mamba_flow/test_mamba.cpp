// Mamba<Cpu> against an independent double-precision reference on odd tiny shapes, plus the streaming,
// state-serialisation and token-validation contracts of docs/models.md#mamba-streaming-decode and docs/formats.md#mamba-decode-state.
#include <doctest/doctest.h>

#include <flowedge/models/mamba_flow/mamba.hpp>
#include "../support/cpu_models_mamba_flow.hpp"

#include "support.hpp"

using namespace flowedge;
using fe_test::TinyShape;

namespace {

struct TinyFile {
    TinyShape shape;
    fe_test::TensorMap tensors;
    std::filesystem::path path;
};

TinyFile tiny_file(const std::string& name, std::uint32_t seed, TinyShape s = {}) {
    TinyFile f{s, fe_test::make_tiny(s, seed), fe_test::temp_path(name)};
    fe_test::write_safetensors(f.path, f.tensors);
    return f;
}

std::vector<int> tokens_of(int n, int vocab, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int> t(static_cast<std::size_t>(n));
    for (auto& v : t) v = int(rng() % std::uint32_t(vocab));
    return t;
}

std::vector<std::int32_t> as_i32(const std::vector<int>& t) { return {t.begin(), t.end()}; }

}  // namespace

TEST_CASE("mamba: config is read from tensor shapes") {
    TinyShape s;
    s.n_layers = 3;
    auto f = tiny_file("cfg.safetensors", 1, s);
    auto m = Mamba<Cpu>::load(f.path, {}, 16);
    CHECK(m.config().n_layers == 3);
    CHECK(m.config().d_model == 5);
    CHECK(m.config().d_inner == 10);
    CHECK(m.config().d_state == 3);
    CHECK(m.config().d_conv == 3);
    CHECK(m.config().dt_rank == 2);
    CHECK(m.config().vocab == 11);
}

TEST_CASE("mamba: prefill matches the naive double reference on odd shapes") {
    for (std::uint32_t seed : {2u, 3u, 4u}) {
        auto f = tiny_file("prefill.safetensors", seed);
        auto m = Mamba<Cpu>::load(f.path, {}, 64);
        for (int L : {1, 2, 3, 7, 29, 64}) {
            auto toks = tokens_of(L, f.shape.vocab, seed * 100 + L);
            fe_test::RefMamba ref(f.shape, f.tensors);
            auto want = ref.run(toks);
            std::vector<float> got(std::size_t(L) * f.shape.d_model);
            m.prefill(as_i32(toks), got);
            const double err = fe_test::rel_err(got, want);
            INFO("seed " << seed << " L " << L << " rel err " << err);
            CHECK(err < 2e-6);
        }
    }
}

TEST_CASE("mamba: streaming steps match the reference and prefill of the whole sequence") {
    auto f = tiny_file("steps.safetensors", 5);
    auto m = Mamba<Cpu>::load(f.path, {}, 64);
    const int dm = f.shape.d_model;
    const auto toks = as_i32(tokens_of(40, f.shape.vocab, 77));
    std::vector<float> whole(toks.size() * std::size_t(dm));
    m.prefill(toks, whole);

    for (int prefix : {1, 4, 13}) {
        std::vector<float> part(std::size_t(prefix) * dm);
        m.prefill(std::span(toks).first(std::size_t(prefix)), part);
        double worst = 0;
        for (int i = 0; i < prefix * dm; ++i) CHECK(part[std::size_t(i)] == doctest::Approx(whole[std::size_t(i)]).epsilon(1e-6));
        std::vector<float> row(static_cast<std::size_t>(dm));
        for (std::size_t t = std::size_t(prefix); t < toks.size(); ++t) {
            m.step(toks[t], row);
            worst = std::max(worst, fe_test::rel_err(row, std::span(whole).subspan(t * dm, std::size_t(dm))));
        }
        INFO("prefix " << prefix << " worst step-vs-prefill rel err " << worst);
        CHECK(worst < 1e-5);
    }

    // Steps from a reset state equal the reference decoding token by token.
    m.reset();
    fe_test::RefMamba ref(f.shape, f.tensors);
    std::vector<float> row(static_cast<std::size_t>(dm));
    double worst = 0;
    for (int t = 0; t < 20; ++t) {
        m.step(toks[std::size_t(t)], row);
        auto want = ref.run({int(toks[std::size_t(t)])});
        worst = std::max(worst, fe_test::rel_err(row, want));
    }
    INFO("decode vs reference " << worst);
    CHECK(worst < 2e-6);
}

TEST_CASE("mamba: export/import round trip and rejection of foreign or damaged state") {
    auto f = tiny_file("state.safetensors", 6);
    auto m = Mamba<Cpu>::load(f.path, {}, 32);
    const int dm = f.shape.d_model;
    auto toks = as_i32(tokens_of(9, f.shape.vocab, 5));
    std::vector<float> h(toks.size() * std::size_t(dm));
    m.prefill(toks, h);
    const auto saved = m.export_state();
    CHECK(saved.size() == m.state_bytes());
    std::vector<std::byte> into(m.state_bytes());
    CHECK(m.export_state(std::span<std::byte>(into)) == m.state_bytes());
    CHECK(into == saved);

    std::vector<float> a(static_cast<std::size_t>(dm)), b(static_cast<std::size_t>(dm));
    m.step(3, a);
    m.step(7, a);
    m.import_state(saved);
    m.step(3, b);
    m.step(7, b);
    CHECK(a == b);  // bit-identical after restoring

    // Another instance of the same model accepts it (e.g. after a restart).
    auto m2 = Mamba<Cpu>::load(f.path, {}, 8);
    m2.import_state(saved);
    m2.step(3, b);
    m2.step(7, b);
    CHECK(a == b);

    auto expect_reject = [&](std::span<const std::byte> bytes, const std::string& needle) {
        bool threw = false;
        try {
            m.import_state(bytes);
        } catch (const Error& e) {
            threw = true;
            INFO(e.what());
            CHECK(std::string(e.what()).find(needle) != std::string::npos);
            CHECK(std::string(e.what()).rfind("flowedge: mamba: ", 0) == 0);
        }
        CHECK(threw);
    };
    // Another shape.
    TinyShape other;
    other.d_state = 4;
    auto g = tiny_file("state_other.safetensors", 6, other);
    auto mo = Mamba<Cpu>::load(g.path, {}, 8);
    expect_reject(mo.export_state(), "another shape");
    // Same shape, other weights.
    auto g2 = tiny_file("state_other_w.safetensors", 99);
    expect_reject(Mamba<Cpu>::load(g2.path, {}, 8).export_state(), "another model");
    // Corrupted payload byte.
    auto bad = saved;
    bad[bad.size() - 3] ^= std::byte{0x10};
    expect_reject(bad, "checksum");
    // Wrong version.
    bad = saved;
    bad[8] = std::byte{7};
    expect_reject(bad, "version");
    // Bad magic, truncation.
    bad = saved;
    bad[0] = std::byte{'X'};
    expect_reject(bad, "magic");
    expect_reject(std::span(saved).first(saved.size() - 4), "size");
    expect_reject(std::span(saved).first(10), "truncated");
    // The state was left untouched by every rejected import.
    m.import_state(saved);
    m.step(3, b);
    m.step(7, b);
    CHECK(a == b);
}

TEST_CASE("mamba: out-of-range tokens and lengths are errors") {
    auto f = tiny_file("tokens.safetensors", 7);
    auto m = Mamba<Cpu>::load(f.path, {}, 8);
    std::vector<float> h(8 * std::size_t(f.shape.d_model));
    const std::vector<std::int32_t> neg{1, -1, 2}, big{1, 2, 11}, huge{std::numeric_limits<std::int32_t>::max()};
    CHECK_THROWS_WITH_AS(m.prefill(neg, h), doctest::Contains("token id out of range at position 1"), Error);
    CHECK_THROWS_WITH_AS(m.prefill(big, h), doctest::Contains("expected 0 <= id < 11, got 11"), Error);
    CHECK_THROWS_AS(m.prefill(huge, h), Error);
    CHECK_THROWS_AS(m.step(11, h), Error);
    CHECK_THROWS_AS(m.step(-5, h), Error);
    CHECK_THROWS_WITH_AS(m.prefill(std::vector<std::int32_t>(9, 1), h), doctest::Contains("prefill length out of range"), Error);
    CHECK_THROWS_AS(m.prefill(std::vector<std::int32_t>{}, h), Error);
    std::vector<float> small(3);
    CHECK_THROWS_AS(m.prefill(std::vector<std::int32_t>{1}, small), Error);
}

TEST_CASE("mamba: missing or inconsistent tensors name the key") {
    TinyShape s;
    auto t = fe_test::make_tiny(s, 8);
    auto p = fe_test::temp_path("missing.safetensors");
    auto t1 = t;
    t1.erase("backbone.layers.1.mixer.D");
    fe_test::write_safetensors(p, t1);
    CHECK_THROWS_WITH_AS(Mamba<Cpu>::load(p), doctest::Contains("backbone.layers.1.mixer.D"), Error);
    auto t2 = t;
    t2["backbone.layers.1.mixer.x_proj.weight"].shape = {s.dt_rank + 2 * s.d_state + 1, s.d_inner - 1};
    t2["backbone.layers.1.mixer.x_proj.weight"].values.resize(std::size_t((s.dt_rank + 2 * s.d_state + 1) * (s.d_inner - 1)));
    fe_test::write_safetensors(p, t2);
    CHECK_THROWS_WITH_AS(Mamba<Cpu>::load(p), doctest::Contains("x_proj.weight"), Error);
    auto t3 = fe_test::make_tiny(s, 8, /*backbone=*/false, /*flow=*/true);
    fe_test::write_safetensors(p, t3);
    CHECK_THROWS_WITH_AS(Mamba<Cpu>::load(p), doctest::Contains("no backbone"), Error);
}

TEST_CASE("mamba: BF16 and F16 projection weights stay within their stated bound of F32") {
    TinyShape s;
    s.d_model = 32;
    s.d_inner = 64;
    s.d_state = 8;
    s.d_conv = 4;
    s.dt_rank = 4;
    s.vocab = 50;
    auto f = tiny_file("bf16.safetensors", 9, s);
    auto toks = as_i32(tokens_of(24, s.vocab, 1));
    std::vector<float> ref(toks.size() * 32), got(ref.size());
    Mamba<Cpu>::load(f.path, {}, 32).prefill(toks, ref);
    Mamba<Cpu>::load(f.path, {.weight_dtype = DType::BF16}, 32).prefill(toks, got);
    const double e_bf16 = fe_test::rel_err(got, ref);
    Mamba<Cpu>::load(f.path, {.weight_dtype = DType::F16}, 32).prefill(toks, got);
    const double e_f16 = fe_test::rel_err(got, ref);
    MESSAGE("hidden rel err vs F32: bf16 " << e_bf16 << ", f16 " << e_f16);
    CHECK(e_bf16 < 1e-2);  // bf16 keeps 8 mantissa bits (2^-9 relative per weight); measured 2.4e-3
    CHECK(e_bf16 > 0);     // the weights really were narrowed
    CHECK(e_f16 < 1.5e-3);  // f16 keeps 11 bits; measured 2.8e-4
}
