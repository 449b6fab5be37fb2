// layer tests: TODO
