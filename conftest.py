# Every CPU core as a JAX device for the whole test session (set before JAX is imported).
import specsample

specsample.use_all_cpu_cores()
