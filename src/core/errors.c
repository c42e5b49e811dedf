/* errors.c - status strings and the last-error message, one per thread. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char pkv_tls_error[512];

uint32_t pkv_version(void) { return PKV_VERSION_MAJOR * 10000u + PKV_VERSION_MINOR * 100u + PKV_VERSION_PATCH; }

const char *pkv_status_string(pkv_status status) {
    switch (status) {
    case PKV_OK: return "ok";
    case PKV_ERR_NULL_POINTER: return "null pointer";
    case PKV_ERR_INVALID_ARGUMENT: return "invalid argument";
    case PKV_ERR_HEAD_GROUP: return "num_qo_heads is not a multiple of num_kv_heads";
    case PKV_ERR_UNSUPPORTED_HEAD_DIM: return "unsupported head dim";
    case PKV_ERR_UNSUPPORTED_DTYPE: return "unsupported dtype";
    case PKV_ERR_NEGATIVE_LENGTH: return "negative sequence length";
    case PKV_ERR_LENGTH_EXCEEDS_PAGES: return "sequence length exceeds the row's pages";
    case PKV_ERR_PAGE_OUT_OF_RANGE: return "page id out of range";
    case PKV_ERR_WORKSPACE_TOO_SMALL: return "workspace too small";
    case PKV_ERR_BAD_INDPTR: return "malformed kv_indptr";
    case PKV_ERR_UNSUPPORTED: return "unsupported";
    case PKV_ERR_BACKEND_UNAVAILABLE: return "backend unavailable";
    case PKV_ERR_CUDA: return "CUDA error";
    case PKV_ERR_OUT_OF_MEMORY: return "out of memory";
    case PKV_ERR_PLAN_MISMATCH: return "plan does not match";
    case PKV_ERR_IO: return "I/O error";
    case PKV_ERR_PARSE: return "parse error";
    case PKV_ERR_PAGE_SIZE: return "unsupported page size";
    case PKV_ERR_BATCH_SIZE: return "invalid batch size";
    case PKV_ERR_POOL_EXHAUSTED: return "page pool exhausted";
    case PKV_ERR_UNKNOWN_REQUEST: return "unknown request";
    case PKV_ERR_REQUEST_FREED: return "request already freed";
    case PKV_ERR_BEYOND_LENGTH: return "beyond the request's length";
    case PKV_ERR_FOREIGN_PAGE: return "page not owned by the request";
    }
    return "unknown status";
}

pkv_status pkv_failv(pkv_status st, const char *fmt, va_list ap) {
    int n = snprintf(pkv_tls_error, sizeof pkv_tls_error, "%s: ", pkv_status_string(st));
    if (n < 0 || (size_t)n >= sizeof pkv_tls_error) n = 0;
    vsnprintf(pkv_tls_error + n, sizeof pkv_tls_error - (size_t)n, fmt, ap);
    return st;
}

/* One error channel: the message is the calling thread's, whichever context the call had. */
pkv_status pkv_fail(pkv_context *ctx, pkv_status st, const char *fmt, ...) {
    (void)ctx;
    va_list ap;
    va_start(ap, fmt);
    pkv_failv(st, fmt, ap);
    va_end(ap);
    return st;
}

void pkv_clear_error(pkv_context *ctx) {
    (void)ctx;
    pkv_tls_error[0] = '\0';
}

const char *pkv_last_error(void) { return pkv_tls_error; }
