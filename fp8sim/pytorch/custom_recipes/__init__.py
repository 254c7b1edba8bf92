"""TE's ``transformer_engine.pytorch.custom_recipes`` (2.20.0.dev0): quantizer factories for
``recipe.CustomRecipe`` (:mod:`.quantizer_factories`)."""
