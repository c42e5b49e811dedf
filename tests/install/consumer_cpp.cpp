// consumer_cpp.cpp - persistentkv.h from C++ (serving stacks are often C++): the header compiles there,
// its declarations have C linkage (this links against the C library), and a plan made from C++ runs.
#include <persistentkv.h>

#include <cstdio>
#include <vector>

int main() {
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CPU;
    pkv_context *ctx = nullptr;
    if (pkv_context_create(&cfg, &ctx) != PKV_OK) return 1;
    pkv_problem p;
    pkv_problem_default(&p); // Hq 32, Hkv 8, d 128, page 16
    p.num_pages = 4;
    const std::vector<int32_t> indptr = {0, 3}, pages = {2, 0, 3}, lens = {40};
    const pkv_page_table t = {1, indptr.data(), pages.data(), lens.data()};
    pkv_plan_options o;
    pkv_plan_options_default(&o);
    pkv_plan *plan = nullptr;
    pkv_status s = pkv_plan_create(&plan);
    if (s == PKV_OK) s = pkv_plan_step(ctx, &p, &t, &o, plan);
    if (s != PKV_OK) {
        std::fprintf(stderr, "consumer_cpp: %s\n", pkv_last_error());
        return 1;
    }
    const size_t nq = 32 * 128, nkv = 4 * 16 * 8 * 128;
    std::vector<uint16_t> q(nq, (uint16_t)0x3400u /* 0.25 */), k(nkv, (uint16_t)0x3800u /* 0.5 */), o_(nq, 0x7e00);
    std::vector<uint16_t> v(nkv);
    for (size_t i = 0; i < nkv; i++) { // the fp16 bits of j / 128, j = i % 128 (exact)
        const unsigned j = (unsigned)(i % 128);
        unsigned e = 0;
        while ((2u << e) <= j) e++; // j in [2^e, 2^(e+1))
        v[i] = j == 0 ? 0 : (uint16_t)(((e + 8u) << 10) | ((j << (10 - e)) & 1023u));
    }
    std::vector<unsigned char> ws(pkv_plan_workspace_size(plan) + 1);
    const pkv_tensors x = {q.data(), k.data(), v.data(), pages.data(), o_.data(), nullptr, 0};
    s = pkv_run(ctx, plan, ws.data(), ws.size(), &x, nullptr);
    // every score is equal (constant q and K), so o is the mean of V over the 40 tokens: V's value at
    // each dim, the same on every page
    bool ok = s == PKV_OK;
    for (size_t i = 0; ok && i < nq; i++) ok = o_[i] == v[i % 128];
    std::printf("consumer_cpp: %s (route %s)\n", ok ? "ok" : "WRONG", pkv_route_name(pkv_plan_route(plan)));
    pkv_plan_free(plan);
    pkv_context_free(ctx);
    return ok ? 0 : 1;
}
