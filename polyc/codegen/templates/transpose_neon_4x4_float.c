#include <arm_neon.h>
#define POLYC_TR_BLOCK 4
typedef float polyc_tr_lane_t;
static inline void polyc_tr_block(const float *s, float *d, int64_t sp, int64_t dp)
{
    const float32x4_t r0 = vld1q_f32(s), r1 = vld1q_f32(s + sp), r2 = vld1q_f32(s + 2 * sp), r3 = vld1q_f32(s + 3 * sp);
    const float32x4_t t0 = vtrn1q_f32(r0, r1), t1 = vtrn2q_f32(r0, r1), t2 = vtrn1q_f32(r2, r3), t3 = vtrn2q_f32(r2, r3);
    vst1q_f32(d, vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2))));
    vst1q_f32(d + dp, vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3))));
    vst1q_f32(d + 2 * dp, vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2))));
    vst1q_f32(d + 3 * dp, vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3))));
}
