/* The emulated cuDNN graph API (cuda_emu_cudnn.h): the backend descriptors the engine's
 * attention uses, validated as cuDNN validates them, and one "engine" whose execution is a
 * host reference of the SDPA forward operation.
 *
 * Descriptors keep what was set; an attribute set with the wrong type is
 * CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, with the wrong count or on a finalized descriptor
 * CUDNN_STATUS_BAD_PARAM, a descriptor argument of the wrong kind
 * CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, one not finalized CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED.
 * A descriptor set into another is copied (cuDNN's descriptors are values too): a plan
 * stays valid when the graph, heuristics and configs it came from are destroyed.
 *
 * The SDPA forward operation (cuDNN 9.19's attributes, no score subgraph, so its only mask
 * is the padding mask of the sequence lengths). Shapes, with Q's batch B:
 *     Q [B, H_q, S_q, D], O [B, H_q, S_q, D_v]
 *     K [B, H_k, S_kv, D], V [B, H_k, S_kv, D_v]            (not paged), or
 *     K [N, H_k, T, D], V [N, H_k, T, D_v] containers of N pages of T tokens, with
 *       page tables PT_K, PT_V [B, 1, P, 1] INT32 (page j of batch b holds its tokens
 *       [j T, (j + 1) T)) and both sequence lengths
 *     SEQ_LEN_Q, SEQ_LEN_KV [B, 1, 1, 1] INT32; SCALE: a by-value FLOAT [1, 1, 1, 1]
 * Any strides with the last (D) stride 1; Q, K, V, O all HALF or all BFLOAT16;
 * H_q a multiple of H_k (GQA: query head h reads kv head h / (H_q / H_k)); D, D_v <= 256
 * and multiples of 8. STATS and the block mask are not emulated (NOT_SUPPORTED).
 *
 * Execution: for each batch b, head h and query row i < seq_len_q[b] (all S_q without
 * sequence lengths): s_j = scale * q.k_j over keys j < seq_len_kv[b], softmax with the
 * maximum subtracted, O = sum_j p_j v_j / sum_j p_j, all in F32 (products summed in index
 * order), O rounded to nearest even. Rows at or past seq_len_q[b] are not written. A page
 * id outside [0, N) or a length past the table (P T) is a bug that would read out of
 * bounds on a GPU: the emulator aborts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <set>
#include <vector>

#include "cuda_emu_internal.h"

struct cudnnContext {
    uint64_t magic;
    cudaStream_t stream;
};

namespace kvg_emu {
namespace {

constexpr uint64_t HANDLE_MAGIC = 0x4b5647444e4e4800ull;
constexpr uint64_t DESC_MAGIC = 0x4b56474445534300ull;

struct Tensor {
    int64_t dtype = -1, uid = -1, align = 0;
    std::vector<int64_t> dims, strides;
    bool is_virtual = false, by_value = false, uid_set = false;
};

/* The SDPA operation's tensors, by role. */
enum Role { R_Q, R_K, R_V, R_O, R_STATS, R_SCALE, R_MASK, R_PTK, R_PTV, R_SQ, R_SKV, N_ROLES };

struct Sdpa {
    Tensor t[N_ROLES];
    bool set[N_ROLES] = {};
};

struct Desc {
    uint64_t magic = DESC_MAGIC;
    cudnnBackendDescriptorType_t type;
    bool finalized = false;
    Tensor tensor;                    /* TENSOR */
    Sdpa op;                          /* SDPA_FWD; OPERATIONGRAPH, ENGINEHEUR, ENGINECFG and
                                         EXECUTION_PLAN carry a copy of their one operation */
    bool has_op = false;
    int64_t heur_mode = -1;
    int64_t workspace = 0;            /* ENGINECFG, EXECUTION_PLAN */
    std::vector<int64_t> uids;        /* VARIANT_PACK */
    std::vector<void *> ptrs;
    void *ws_ptr = nullptr;
    bool uids_set = false, ptrs_set = false;
};

std::set<cudnnHandle_t> &handles()
{
    static std::set<cudnnHandle_t> h;
    return h;
}

std::set<Desc *> &descs()
{
    static std::set<Desc *> d;
    return d;
}

bool handle_ok(cudnnHandle_t h)
{
    return h && handles().count(h) && h->magic == HANDLE_MAGIC;
}

Desc *desc_of(cudnnBackendDescriptor_t p)
{
    Desc *d = (Desc *)p;
    return d && descs().count(d) && d->magic == DESC_MAGIC ? d : nullptr;
}

size_t dtype_size(int64_t t)
{
    switch (t) {
    case CUDNN_DATA_FLOAT: return 4;
    case CUDNN_DATA_HALF: return 2;
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT32: return 4;
    case CUDNN_DATA_INT64: return 8;
    }
    return 0;
}

/* Elements from the first to one past the last of a strided tensor. */
int64_t extent(const Tensor &t)
{
    int64_t e = 1;
    for (size_t i = 0; i < t.dims.size(); i++)
        e += (t.dims[i] - 1) * t.strides[i];
    return e;
}

bool dims_are(const Tensor &t, std::initializer_list<int64_t> want)
{
    size_t i = 0;
    for (int64_t w : want)
        if (t.dims[i++] != w)
            return false;
    return true;
}

/* The operation's checks at finalize (what cuDNN's SDPA node refuses). */
cudnnStatus_t check_sdpa(const Sdpa &op)
{
    const Tensor *t = op.t;
    for (Role r : {R_Q, R_K, R_V, R_O})
        if (!op.set[r])
            return CUDNN_STATUS_BAD_PARAM;
    if (op.set[R_STATS] || op.set[R_MASK])
        return CUDNN_STATUS_NOT_SUPPORTED;   /* not emulated */
    std::set<int64_t> uids;
    for (int r = 0; r < N_ROLES; r++) {
        if (!op.set[r])
            continue;
        if (t[r].is_virtual)
            return CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN;
        /* the same tensor may fill two roles (one page table for K and V) */
        bool again = false;
        for (int s = 0; s < r; s++)
            if (op.set[s] && t[s].uid == t[r].uid) {
                if (t[s].dims != t[r].dims || t[s].strides != t[r].strides || t[s].dtype != t[r].dtype)
                    return CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES;
                again = true;
            }
        if (!again && !uids.insert(t[r].uid).second)
            return CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES;
    }
    for (Role r : {R_Q, R_K, R_V, R_O}) {
        if (t[r].dims.size() != 4)
            return CUDNN_STATUS_BAD_PARAM;
        if (t[r].strides[3] != 1)
            return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
    }
    int64_t dt = t[R_Q].dtype;
    if (dt != CUDNN_DATA_HALF && dt != CUDNN_DATA_BFLOAT16)
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    for (Role r : {R_K, R_V, R_O})
        if (t[r].dtype != dt)
            return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    int64_t B = t[R_Q].dims[0], Hq = t[R_Q].dims[1], Sq = t[R_Q].dims[2], D = t[R_Q].dims[3];
    int64_t Hk = t[R_K].dims[1], Dv = t[R_V].dims[3];
    if (!dims_are(t[R_O], {B, Hq, Sq, Dv}) || t[R_K].dims[3] != D || t[R_V].dims[1] != Hk ||
        t[R_V].dims[0] != t[R_K].dims[0] || t[R_V].dims[2] != t[R_K].dims[2] || Hq % Hk != 0)
        return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    if (D > 256 || Dv > 256 || D % 8 || Dv % 8)
        return CUDNN_STATUS_NOT_SUPPORTED_SHAPE;
    bool paged = op.set[R_PTK] || op.set[R_PTV];
    if (paged && !(op.set[R_PTK] && op.set[R_PTV]))
        return CUDNN_STATUS_BAD_PARAM;
    if (op.set[R_SQ] != op.set[R_SKV] || (paged && !op.set[R_SQ]))
        return CUDNN_STATUS_BAD_PARAM;
    if (!paged && t[R_K].dims[0] != B)
        return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    if (paged) {
        for (Role r : {R_PTK, R_PTV}) {
            if (t[r].dtype != CUDNN_DATA_INT32)
                return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
            if (t[r].dims.size() != 4 || !dims_are(t[r], {B, 1, t[r].dims[2], 1}))
                return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        }
        if (t[R_PTK].dims[2] != t[R_PTV].dims[2])
            return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    }
    if (op.set[R_SQ])
        for (Role r : {R_SQ, R_SKV}) {
            if (t[r].dtype != CUDNN_DATA_INT32)
                return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
            if (t[r].dims.size() != 4 || !dims_are(t[r], {B, 1, 1, 1}))
                return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        }
    if (op.set[R_SCALE]) {
        const Tensor &s = t[R_SCALE];
        if (!s.by_value || s.dtype != CUDNN_DATA_FLOAT)
            return CUDNN_STATUS_NOT_SUPPORTED;
        for (int64_t d : s.dims)
            if (d != 1)
                return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    }
    return CUDNN_STATUS_SUCCESS;
}

/* The emulated engine's workspace: 8 bytes per (batch, query head), so that the caller's
 * workspace handling is exercised (a GPU's kernel might keep split statistics there). */
int64_t workspace_of(const Sdpa &op)
{
    return op.t[R_Q].dims[0] * op.t[R_Q].dims[1] * 8;
}

float load(const unsigned short *p, int64_t i, bool bf16)
{
    return bf16 ? kvg_emu_bf16_bits_to_f32(p[i]) : kvg_emu_f16_bits_to_f32(p[i]);
}

/* The reference attention (see the file's comment), on the stream. */
void run_sdpa(const Sdpa &op, const void *const *ptr, float scale)
{
    const Tensor *t = op.t;
    bool bf16 = t[R_Q].dtype == CUDNN_DATA_BFLOAT16;
    bool paged = op.set[R_PTK], lens = op.set[R_SQ];
    int64_t B = t[R_Q].dims[0], Hq = t[R_Q].dims[1], Sq = t[R_Q].dims[2], D = t[R_Q].dims[3];
    int64_t Hk = t[R_K].dims[1], Dv = t[R_V].dims[3];
    int64_t N = t[R_K].dims[0], T = t[R_K].dims[2];
    int64_t P = paged ? t[R_PTK].dims[2] : 0;
    const unsigned short *q = (const unsigned short *)ptr[R_Q], *k = (const unsigned short *)ptr[R_K];
    const unsigned short *v = (const unsigned short *)ptr[R_V];
    unsigned short *o = (unsigned short *)ptr[R_O];
    std::vector<float> s, acc(Dv);
    for (int64_t b = 0; b < B; b++) {
        int64_t nq = Sq, nk = paged ? 0 : T;
        if (lens) {
            nq = ((const int32_t *)ptr[R_SQ])[b * t[R_SQ].strides[0]];
            nk = ((const int32_t *)ptr[R_SKV])[b * t[R_SKV].strides[0]];
            if (nq < 0 || nq > Sq || nk < 0 || nk > (paged ? P * T : T))
                fatal("cudnnBackendExecute: SDPA batch %lld: sequence lengths q %lld, kv %lld outside "
                      "[0, %lld] and [0, %lld]", (long long)b, (long long)nq, (long long)nk, (long long)Sq,
                      (long long)(paged ? P * T : T));
        }
        /* the keys' element offsets (without the head's): token j's page and slot */
        std::vector<int64_t> koff(nk), voff(nk);
        for (int64_t j = 0; j < nk; j++) {
            if (paged) {
                int32_t pk = ((const int32_t *)ptr[R_PTK])[b * t[R_PTK].strides[0] + (j / T) * t[R_PTK].strides[2]];
                int32_t pv = ((const int32_t *)ptr[R_PTV])[b * t[R_PTV].strides[0] + (j / T) * t[R_PTV].strides[2]];
                if (pk < 0 || pk >= N || pv < 0 || pv >= N)
                    fatal("cudnnBackendExecute: SDPA batch %lld: page table entry %lld is page %d/%d of a "
                          "container of %lld", (long long)b, (long long)(j / T), (int)pk, (int)pv, (long long)N);
                koff[j] = pk * t[R_K].strides[0] + (j % T) * t[R_K].strides[2];
                voff[j] = pv * t[R_V].strides[0] + (j % T) * t[R_V].strides[2];
            } else {
                koff[j] = b * t[R_K].strides[0] + j * t[R_K].strides[2];
                voff[j] = b * t[R_V].strides[0] + j * t[R_V].strides[2];
            }
        }
        s.resize(nk);
        for (int64_t h = 0; h < Hq; h++) {
            int64_t hk = h / (Hq / Hk);
            for (int64_t i = 0; i < nq; i++) {
                int64_t qo = b * t[R_Q].strides[0] + h * t[R_Q].strides[1] + i * t[R_Q].strides[2];
                int64_t oo = b * t[R_O].strides[0] + h * t[R_O].strides[1] + i * t[R_O].strides[2];
                float m = -INFINITY, l = 0.0f;
                for (int64_t j = 0; j < nk; j++) {
                    const int64_t ko = koff[j] + hk * t[R_K].strides[1];
                    float dot = 0.0f;
                    for (int64_t d = 0; d < D; d++)
                        dot += load(q, qo + d, bf16) * load(k, ko + d, bf16);
                    s[j] = scale * dot;
                    if (s[j] > m)
                        m = s[j];
                }
                for (int64_t d = 0; d < Dv; d++)
                    acc[d] = 0.0f;
                for (int64_t j = 0; j < nk; j++) {
                    float p = expf(s[j] - m);
                    const int64_t vo = voff[j] + hk * t[R_V].strides[1];
                    l += p;
                    for (int64_t d = 0; d < Dv; d++)
                        acc[d] += p * load(v, vo + d, bf16);
                }
                for (int64_t d = 0; d < Dv; d++) {
                    float x = l > 0.0f ? acc[d] / l : 0.0f;
                    o[oo + d] = bf16 ? kvg_emu_f32_to_bf16_bits(x) : kvg_emu_f32_to_f16_bits(x);
                }
            }
        }
    }
}

/* Attribute arguments: the type and the count must be what the attribute takes. */
#define WANT(T, n)                                                                   \
    do {                                                                             \
        if (attributeType != (T))                                                    \
            return CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE;                            \
        if ((n) >= 0 ? elementCount != (n) : elementCount < 1)                       \
            return CUDNN_STATUS_BAD_PARAM;                                           \
    } while (0)

int64_t i64_at(const void *a, int64_t i)
{
    int64_t v;
    memcpy(&v, (const char *)a + i * sizeof v, sizeof v);
    return v;
}

bool bool_at(const void *a)
{
    bool v;
    memcpy(&v, a, sizeof v);
    return v;
}

/* A descriptor argument (arrays of cudnnBackendDescriptor_t): of `type`, finalized. */
cudnnStatus_t desc_arg(const void *a, int64_t i, cudnnBackendDescriptorType_t type, Desc **out)
{
    cudnnBackendDescriptor_t p;
    memcpy(&p, (const char *)a + i * sizeof p, sizeof p);
    Desc *d = desc_of(p);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    if (d->type != type)
        return CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE;
    if (!d->finalized)
        return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
    *out = d;
    return CUDNN_STATUS_SUCCESS;
}

Role role_of(cudnnBackendAttributeName_t n)
{
    switch (n) {
    case CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC: return R_Q;
    case CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC: return R_K;
    case CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC: return R_V;
    case CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC: return R_O;
    case CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC: return R_STATS;
    case CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC: return R_SCALE;
    case CUDNN_ATTR_OPERATION_SDPA_FWD_BLOCK_MASK_DESC: return R_MASK;
    case CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_KDESC: return R_PTK;
    case CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_VDESC: return R_PTV;
    case CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC: return R_SQ;
    case CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_KVDESC: return R_SKV;
    default: return N_ROLES;
    }
}

}  // namespace
}  // namespace kvg_emu

using namespace kvg_emu;

extern "C" {

size_t cudnnGetVersion(void)
{
    /* not counted or injectable: a test plays an older library by the environment */
    const char *v = getenv("KVG_EMU_CUDNN_VERSION");
    if (v && *v)
        return (size_t)strtoull(v, nullptr, 10);
    return CUDNN_VERSION;
}

const char *cudnnGetErrorString(cudnnStatus_t status)
{
    switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED: return "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND: return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
    case CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT: return "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT";
    case CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES: return "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES";
    case CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE: return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
    case CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE: return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH: return "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
        return "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    }
    return "CUDNN_STATUS_UNKNOWN";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (int e = injected("cudnnCreate", CUDNN_STATUS_NOT_INITIALIZED))
        return (cudnnStatus_t)e;
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (device_state() != cudaSuccess)
        return CUDNN_STATUS_NOT_INITIALIZED;
    cudnnHandle_t h = new cudnnContext{HANDLE_MAGIC, nullptr};
    handles().insert(h);
    *handle = h;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    injected("cudnnDestroy", 0);
    if (!handle_ok(handle))
        return CUDNN_STATUS_BAD_PARAM;
    handles().erase(handle);
    handle->magic = 0;
    delete handle;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (int e = injected("cudnnSetStream", CUDNN_STATUS_BAD_PARAM))
        return (cudnnStatus_t)e;
    if (!handle_ok(handle) || !valid_stream(streamId))
        return CUDNN_STATUS_BAD_PARAM;
    handle->stream = streamId;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                           cudnnBackendDescriptor_t *descriptor)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (int e = injected("cudnnBackendCreateDescriptor", CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED))
        return (cudnnStatus_t)e;
    if (!descriptor)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    switch (descriptorType) {
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR:
        break;
    default:
        return CUDNN_STATUS_NOT_SUPPORTED;   /* not emulated */
    }
    Desc *d = new Desc;
    d->type = descriptorType;
    descs().insert(d);
    *descriptor = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    injected("cudnnBackendDestroyDescriptor", 0);
    Desc *d = desc_of(descriptor);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    descs().erase(d);
    d->magic = 0;
    delete d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType,
                                       int64_t elementCount, const void *arrayOfElements)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (int e = injected("cudnnBackendSetAttribute", CUDNN_STATUS_BAD_PARAM))
        return (cudnnStatus_t)e;
    Desc *d = desc_of(descriptor);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    if (!arrayOfElements)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (d->finalized)
        return CUDNN_STATUS_BAD_PARAM;
    const void *a = arrayOfElements;
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
        Tensor &t = d->tensor;
        switch (attributeName) {
        case CUDNN_ATTR_TENSOR_DATA_TYPE: {
            WANT(CUDNN_TYPE_DATA_TYPE, 1);
            cudnnDataType_t v;
            memcpy(&v, a, sizeof v);
            t.dtype = v;
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_ATTR_TENSOR_DIMENSIONS:
        case CUDNN_ATTR_TENSOR_STRIDES: {
            WANT(CUDNN_TYPE_INT64, -1);
            if (elementCount > 8)
                return CUDNN_STATUS_BAD_PARAM;
            std::vector<int64_t> v(elementCount);
            for (int64_t i = 0; i < elementCount; i++)
                v[i] = i64_at(a, i);
            (attributeName == CUDNN_ATTR_TENSOR_DIMENSIONS ? t.dims : t.strides) = v;
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_ATTR_TENSOR_UNIQUE_ID:
            WANT(CUDNN_TYPE_INT64, 1);
            t.uid = i64_at(a, 0);
            t.uid_set = true;
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
            WANT(CUDNN_TYPE_INT64, 1);
            t.align = i64_at(a, 0);
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_IS_VIRTUAL:
            WANT(CUDNN_TYPE_BOOLEAN, 1);
            t.is_virtual = bool_at(a);
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_ATTR_TENSOR_IS_BY_VALUE:
            WANT(CUDNN_TYPE_BOOLEAN, 1);
            t.by_value = bool_at(a);
            return CUDNN_STATUS_SUCCESS;
        default:
            return CUDNN_STATUS_BAD_PARAM;
        }
    }
    case CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR: {
        Role r = role_of(attributeName);
        if (r == N_ROLES)
            return CUDNN_STATUS_BAD_PARAM;
        WANT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1);
        Desc *t;
        if (cudnnStatus_t s = desc_arg(a, 0, CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t))
            return s;
        d->op.t[r] = t->tensor;
        d->op.set[r] = true;
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        if (attributeName == CUDNN_ATTR_OPERATIONGRAPH_OPS) {
            WANT(CUDNN_TYPE_BACKEND_DESCRIPTOR, -1);
            if (elementCount != 1)
                return CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN;   /* the one op emulated */
            Desc *op;
            if (cudnnStatus_t s = desc_arg(a, 0, CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, &op))
                return s;
            d->op = op->op;
            d->has_op = true;
            return CUDNN_STATUS_SUCCESS;
        }
        if (attributeName == (cudnnBackendAttributeName_t)800 /* OPERATIONGRAPH_HANDLE */) {
            WANT(CUDNN_TYPE_HANDLE, 1);
            cudnnHandle_t h;
            memcpy(&h, a, sizeof h);
            return handle_ok(h) ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
        }
        return CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        if (attributeName == CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH) {
            WANT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1);
            Desc *gr;
            if (cudnnStatus_t s = desc_arg(a, 0, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &gr))
                return s;
            d->op = gr->op;
            d->has_op = true;
            return CUDNN_STATUS_SUCCESS;
        }
        if (attributeName == CUDNN_ATTR_ENGINEHEUR_MODE) {
            WANT(CUDNN_TYPE_HEUR_MODE, 1);
            cudnnBackendHeurMode_t m;
            memcpy(&m, a, sizeof m);
            if (m < CUDNN_HEUR_MODE_INSTANT || m > CUDNN_HEUR_MODE_A)
                return CUDNN_STATUS_BAD_PARAM;
            d->heur_mode = m;
            return CUDNN_STATUS_SUCCESS;
        }
        return CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        if (attributeName == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG) {
            WANT(CUDNN_TYPE_BACKEND_DESCRIPTOR, 1);
            Desc *cfg;
            if (cudnnStatus_t s = desc_arg(a, 0, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg))
                return s;
            d->op = cfg->op;
            d->has_op = true;
            d->workspace = cfg->workspace;
            return CUDNN_STATUS_SUCCESS;
        }
        if (attributeName == (cudnnBackendAttributeName_t)400 /* EXECUTION_PLAN_HANDLE */) {
            WANT(CUDNN_TYPE_HANDLE, 1);
            cudnnHandle_t h;
            memcpy(&h, a, sizeof h);
            return handle_ok(h) ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
        }
        return CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        if (attributeName == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS) {
            WANT(CUDNN_TYPE_INT64, -1);
            d->uids.assign((const int64_t *)a, (const int64_t *)a + elementCount);
            d->uids_set = true;
            return CUDNN_STATUS_SUCCESS;
        }
        if (attributeName == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS) {
            WANT(CUDNN_TYPE_VOID_PTR, -1);
            d->ptrs.assign((void *const *)a, (void *const *)a + elementCount);
            d->ptrs_set = true;
            return CUDNN_STATUS_SUCCESS;
        }
        if (attributeName == CUDNN_ATTR_VARIANT_PACK_WORKSPACE) {
            WANT(CUDNN_TYPE_VOID_PTR, 1);
            memcpy(&d->ws_ptr, a, sizeof d->ws_ptr);
            return CUDNN_STATUS_SUCCESS;
        }
        return CUDNN_STATUS_BAD_PARAM;
    default:
        return CUDNN_STATUS_BAD_PARAM;   /* ENGINECFG: filled by the heuristics only here */
    }
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (int e = injected("cudnnBackendFinalize", CUDNN_STATUS_NOT_SUPPORTED))
        return (cudnnStatus_t)e;
    Desc *d = desc_of(descriptor);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    if (d->finalized)
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
        const Tensor &t = d->tensor;
        if (t.dtype < 0 || !dtype_size(t.dtype) || !t.uid_set || t.dims.empty() ||
            t.dims.size() != t.strides.size() || t.align <= 0 || (t.align & (t.align - 1)))
            return CUDNN_STATUS_BAD_PARAM;
        for (size_t i = 0; i < t.dims.size(); i++)
            if (t.dims[i] < 1 || t.strides[i] < 1)
                return CUDNN_STATUS_BAD_PARAM;
        break;
    }
    case CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR:
        s = check_sdpa(d->op);
        break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        if (!d->has_op)
            return CUDNN_STATUS_BAD_PARAM;
        break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        if (!d->has_op || d->heur_mode < 0)
            return CUDNN_STATUS_BAD_PARAM;
        break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
        if (!d->has_op)
            return CUDNN_STATUS_BAD_PARAM;
        /* cuDNN's SDPA kernels need sm_80 or newer */
        int dev = 0;
        struct cudaDeviceProp prop;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return CUDNN_STATUS_NOT_INITIALIZED;
        }
        if (prop.major < 8)
            return CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH;
        break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        if (!d->uids_set || !d->ptrs_set || d->uids.size() != d->ptrs.size())
            return CUDNN_STATUS_BAD_PARAM;
        break;
    default:
        return CUDNN_STATUS_BAD_PARAM;
    }
    if (s == CUDNN_STATUS_SUCCESS)
        d->finalized = true;
    return s;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType,
                                       int64_t requestedElementCount, int64_t *elementCount,
                                       void *arrayOfElements)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (int e = injected("cudnnBackendGetAttribute", CUDNN_STATUS_BAD_PARAM))
        return (cudnnStatus_t)e;
    Desc *d = desc_of(descriptor);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    if (!d->finalized)
        return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
    if (requestedElementCount < 0 || (requestedElementCount > 0 && !arrayOfElements))
        return CUDNN_STATUS_BAD_PARAM;
    if (d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && attributeName == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        /* One engine, for any SDPA graph (whether it supports the shapes is the plan's
         * finalize's answer, as on a GPU). The caller passes ENGINECFG descriptors that
         * it created; the first is filled and finalized. */
        if (attributeType != CUDNN_TYPE_BACKEND_DESCRIPTOR)
            return CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE;
        if (requestedElementCount > 0) {
            cudnnBackendDescriptor_t p;
            memcpy(&p, arrayOfElements, sizeof p);
            Desc *cfg = desc_of(p);
            if (!cfg)
                return CUDNN_STATUS_BAD_PARAM;
            if (cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
                return CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE;
            cfg->op = d->op;
            cfg->has_op = true;
            cfg->workspace = workspace_of(d->op);
            cfg->finalized = true;
        }
        if (elementCount)
            *elementCount = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    if ((d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR &&
         attributeName == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) ||
        (d->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && attributeName == CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE)) {
        if (attributeType != CUDNN_TYPE_INT64)
            return CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE;
        if (requestedElementCount > 0)
            memcpy(arrayOfElements, &d->workspace, sizeof d->workspace);
        if (elementCount)
            *elementCount = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    return CUDNN_STATUS_NOT_SUPPORTED;   /* not emulated */
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack)
{
    std::lock_guard<std::recursive_mutex> g(lock());
    if (int e = injected("cudnnBackendExecute", CUDNN_STATUS_EXECUTION_FAILED))
        return (cudnnStatus_t)e;
    if (!handle_ok(handle))
        return CUDNN_STATUS_BAD_PARAM;
    Desc *plan = desc_of(executionPlan), *pack = desc_of(variantPack);
    if (!plan || !pack)
        return CUDNN_STATUS_BAD_PARAM;
    if (plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
        return CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE;
    if (!plan->finalized || !pack->finalized)
        return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
    if (device_state() != cudaSuccess)
        return CUDNN_STATUS_EXECUTION_FAILED;
    const Sdpa op = plan->op;
    const void *ptr[N_ROLES] = {};
    float scale = 1.0f;
    for (int r = 0; r < N_ROLES; r++) {
        if (!op.set[r])
            continue;
        const Tensor &t = op.t[r];
        size_t i = 0;
        while (i < pack->uids.size() && pack->uids[i] != t.uid)
            i++;
        if (i == pack->uids.size() || !pack->ptrs[i]) {
            fprintf(stderr, "kvg-emu: cudnnBackendExecute: no pointer for tensor %lld in the variant pack\n",
                    (long long)t.uid);
            return CUDNN_STATUS_BAD_PARAM;
        }
        ptr[r] = pack->ptrs[i];
        if (t.by_value) {
            /* a by-value tensor is read from the host at the call */
            memcpy(&scale, ptr[r], sizeof scale);
            continue;
        }
        if ((uintptr_t)ptr[r] % (uintptr_t)t.align)
            return CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER;
        size_t bytes = (size_t)extent(t) * dtype_size(t.dtype);
        if (!in_device(ptr[r], bytes)) {
            fprintf(stderr, "kvg-emu: cudnnBackendExecute: tensor %lld (%p, %zu bytes) is not inside one "
                    "device allocation\n", (long long)t.uid, ptr[r], bytes);
            return CUDNN_STATUS_BAD_PARAM;
        }
    }
    if (plan->workspace > 0 && (!pack->ws_ptr || !in_device(pack->ws_ptr, (size_t)plan->workspace))) {
        fprintf(stderr, "kvg-emu: cudnnBackendExecute: the plan needs %lld bytes of device workspace, the "
                "variant pack has %p\n", (long long)plan->workspace, pack->ws_ptr);
        return CUDNN_STATUS_BAD_PARAM;
    }
    /* The attention runs in the stream's order; what it reads is captured by value (the
     * descriptors may be destroyed once the call returns). */
    std::vector<const void *> p(ptr, ptr + N_ROLES);
    on_stream(handle->stream, [op, p, scale]() { run_sdpa(op, p.data(), scale); });
    return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
