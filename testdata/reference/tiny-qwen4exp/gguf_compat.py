import gguf
from gguf import GGUFValueType as VT

_KEYS = {  # method -> (key suffix, type, array element type)
    "add_attention_compress_ratios": ("attention.compress_ratios", VT.ARRAY, VT.INT32),
    "add_hyper_connection_count": ("hyper_connection.count", VT.UINT32, None),
    "add_hyper_connection_low_rank": ("hyper_connection.low_rank", VT.UINT32, None),
    "add_ple_conv_kernel": ("ple.conv_kernel", VT.UINT32, None),
    "add_ple_eos_token_id": ("ple.eos_token_id", VT.UINT32, None),
    "add_ple_head_offsets": ("ple.head_offsets", VT.ARRAY, VT.UINT64),
    "add_ple_head_vocab_sizes": ("ple.head_vocab_sizes", VT.ARRAY, VT.UINT64),
    "add_ple_heads_per_ngram": ("ple.heads_per_ngram", VT.UINT32, None),
    "add_ple_layer_multipliers": ("ple.layer_multipliers", VT.ARRAY, VT.UINT64),
    "add_ple_layers": ("ple.layers", VT.ARRAY, VT.INT32),
    "add_ple_ngram_size": ("ple.ngram_size", VT.UINT32, None),
    "add_recurrent_layers": ("attention.recurrent_layers", VT.ARRAY, VT.BOOL),
}
def _method(suffix, vtype, sub):
    def add(self, val):
        self.add_key_value(f"{self.arch}.{suffix}", val, vtype, sub_type=sub)
    return add
for name, spec in _KEYS.items():
    if not hasattr(gguf.GGUFWriter, name):
        setattr(gguf.GGUFWriter, name, _method(*spec))
