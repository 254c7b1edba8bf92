"""TE's ``transformer_engine.pytorch.custom_recipes`` (2.20.0.dev0): quantizer factories for
``recipe.CustomRecipe`` (:mod:`.quantizer_factories`, :mod:`.quantizer_factory_zoo`), TE's pure-PyTorch
reference quantizers (:mod:`.reference_nvfp4`, :mod:`.reference_current_scaling`, :mod:`.reference_utils`)
and the custom-GEMM dispatch their tensors take (:mod:`.gemm`)."""
