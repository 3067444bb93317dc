"""The ladder's ceilings: register-only FMA loops (f32, vec4<f32>, vec2<f16>, vec4<f16>).

roofline.wgsl, timed by istanbul.shaders.ladder.measure_roofline next to the copy bandwidth (the
elementwise family's copy_vec4) for the roofline fraction of every benchmark.
"""
